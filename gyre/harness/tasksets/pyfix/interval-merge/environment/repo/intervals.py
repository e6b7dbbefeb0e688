def merge(intervals):
    """Merge overlapping closed intervals [(a, b), ...]; result sorted."""
    out = []
    for a, b in intervals:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out
