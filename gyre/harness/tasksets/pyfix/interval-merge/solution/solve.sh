#!/usr/bin/env bash
# Reference solution (Harbor's oracle): write the fixed module.
cat > intervals.py <<'GYRE_EOF'
def merge(intervals):
    """Merge overlapping closed intervals [(a, b), ...]; result sorted."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
GYRE_EOF
