#!/usr/bin/env bash
# Reference solution (Harbor's oracle): write the fixed module.
cat > dedupe.py <<'GYRE_EOF'
def dedupe(items):
    """Remove duplicates, keeping the first occurrence of each item in order."""
    seen, out = set(), []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out
GYRE_EOF
