from rle import encode


def test_basic():
    assert encode("aaab") == "a3b1"

def test_single():
    assert encode("x") == "x1"

def test_empty():
    assert encode("") == ""

def test_alternating():
    assert encode("abab") == "a1b1a1b1"
