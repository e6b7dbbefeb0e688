def flatten(items):
    """Flatten arbitrarily nested lists into one flat list."""
    out = []
    for x in items:
        if isinstance(x, list):
            out.extend(x)
        else:
            out.append(x)
    return out
