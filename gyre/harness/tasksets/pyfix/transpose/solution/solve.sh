#!/usr/bin/env bash
# Reference solution (Harbor's oracle): write the fixed module.
cat > matrix.py <<'GYRE_EOF'
def transpose(m):
    """Transpose a list-of-rows matrix (any shape)."""
    if not m:
        return []
    return [[row[i] for row in m] for i in range(len(m[0]))]
GYRE_EOF
