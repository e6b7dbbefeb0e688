from palindrome import is_palindrome


def test_case():
    assert is_palindrome("Level")
