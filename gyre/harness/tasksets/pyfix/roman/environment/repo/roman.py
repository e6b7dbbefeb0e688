def to_roman(n):
    """Convert 1 <= n <= 3999 to a Roman numeral."""
    pairs = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]
    out = ""
    for value, sym in pairs:
        while n >= value:
            out += sym
            n -= value
    return out
