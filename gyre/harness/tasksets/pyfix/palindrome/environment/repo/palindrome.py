def is_palindrome(s):
    """True if s reads the same both ways, ignoring case, spaces and punctuation."""
    return s == s[::-1]
