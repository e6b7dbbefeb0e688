from bsearch import find


def test_last():
    assert find([1, 3, 5, 7], 7) == 3

def test_first():
    assert find([1, 3, 5, 7], 1) == 0

def test_single():
    assert find([4], 4) == 0

def test_missing():
    assert find([1, 3, 5], 4) == -1
