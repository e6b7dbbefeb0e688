#!/usr/bin/env bash
# Reference solution (Harbor's oracle): write the fixed module.
cat > rle.py <<'GYRE_EOF'
def encode(s):
    """Run-length encode: 'aaab' -> 'a3b1'."""
    if not s:
        return ""
    out, prev, n = [], s[0], 0
    for c in s:
        if c == prev:
            n += 1
        else:
            out.append(f"{prev}{n}")
            prev, n = c, 1
    out.append(f"{prev}{n}")
    return "".join(out)
GYRE_EOF
