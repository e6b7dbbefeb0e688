#!/usr/bin/env bash
# Reference solution (Harbor's oracle): write the fixed module.
cat > flatten.py <<'GYRE_EOF'
def flatten(items):
    """Flatten arbitrarily nested lists into one flat list."""
    out = []
    for x in items:
        if isinstance(x, list):
            out.extend(flatten(x))
        else:
            out.append(x)
    return out
GYRE_EOF
