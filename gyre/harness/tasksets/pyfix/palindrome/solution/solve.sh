#!/usr/bin/env bash
# Reference solution (Harbor's oracle): write the fixed module.
cat > palindrome.py <<'GYRE_EOF'
def is_palindrome(s):
    """True if s reads the same both ways, ignoring case, spaces and punctuation."""
    t = [c.lower() for c in s if c.isalnum()]
    return t == t[::-1]
GYRE_EOF
