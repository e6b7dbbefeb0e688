#!/usr/bin/env bash
# Reference solution (Harbor's oracle): write the fixed module.
cat > slugify.py <<'GYRE_EOF'
import re

def slugify(title):
    """'Hello, World!' -> 'hello-world'"""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
GYRE_EOF
