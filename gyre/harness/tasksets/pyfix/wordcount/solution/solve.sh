#!/usr/bin/env bash
# Reference solution (Harbor's oracle): write the fixed module.
cat > wordcount.py <<'GYRE_EOF'
import string

def word_counts(text):
    """Count words case-insensitively, ignoring surrounding punctuation."""
    counts = {}
    for word in text.split():
        w = word.strip(string.punctuation).lower()
        if w:
            counts[w] = counts.get(w, 0) + 1
    return counts
GYRE_EOF
