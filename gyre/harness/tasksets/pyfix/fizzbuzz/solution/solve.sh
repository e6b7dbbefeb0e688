#!/usr/bin/env bash
# Reference solution (Harbor's oracle): write the fixed module.
cat > fizzbuzz.py <<'GYRE_EOF'
def fizzbuzz(n):
    """Return the FizzBuzz words for 1..n inclusive."""
    out = []
    for i in range(1, n + 1):
        if i % 15 == 0:
            out.append("FizzBuzz")
        elif i % 3 == 0:
            out.append("Fizz")
        elif i % 5 == 0:
            out.append("Buzz")
        else:
            out.append(str(i))
    return out
GYRE_EOF
