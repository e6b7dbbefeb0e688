def transpose(m):
    """Transpose a list-of-rows matrix (any shape)."""
    n = len(m)
    return [[m[j][i] for j in range(n)] for i in range(n)]
