from matrix import transpose


def test_wide():
    assert transpose([[1, 2, 3]]) == [[1], [2], [3]]

def test_square():
    assert transpose([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]

def test_tall():
    assert transpose([[1], [2]]) == [[1, 2]]

def test_empty():
    assert transpose([]) == []
