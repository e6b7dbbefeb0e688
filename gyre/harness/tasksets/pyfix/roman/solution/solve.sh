#!/usr/bin/env bash
# Reference solution (Harbor's oracle): write the fixed module.
cat > roman.py <<'GYRE_EOF'
def to_roman(n):
    """Convert 1 <= n <= 3999 to a Roman numeral."""
    pairs = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
             (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
    out = ""
    for value, sym in pairs:
        while n >= value:
            out += sym
            n -= value
    return out
GYRE_EOF
