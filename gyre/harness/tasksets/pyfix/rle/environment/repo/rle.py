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
    return "".join(out)
