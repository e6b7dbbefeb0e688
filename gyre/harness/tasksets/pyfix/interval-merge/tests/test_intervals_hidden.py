from intervals import merge


def test_unsorted():
    assert merge([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]

def test_contained():
    assert merge([(1, 10), (2, 3)]) == [(1, 10)]

def test_touching():
    assert merge([(1, 2), (2, 4)]) == [(1, 4)]

def test_empty():
    assert merge([]) == []
