"""Untrusted names (task folders, run folders, task ids) printed to a terminal: control
characters become visible escapes so a name cannot retitle or rewrite the user's terminal."""
def printable(s: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)
