from matrix import transpose


def test_wide():
    assert transpose([[1, 2, 3]]) == [[1], [2], [3]]
