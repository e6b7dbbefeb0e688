from palindrome import is_palindrome


def test_case():
    assert is_palindrome("Level")

def test_sentence():
    assert is_palindrome("A man, a plan, a canal: Panama")

def test_not():
    assert not is_palindrome("gyre")

def test_empty():
    assert is_palindrome("")
