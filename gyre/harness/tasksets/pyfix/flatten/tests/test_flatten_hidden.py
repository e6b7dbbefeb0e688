from flatten import flatten


def test_deep():
    assert flatten([1, [2, [3, [4]]]]) == [1, 2, 3, 4]

def test_flat():
    assert flatten([1, 2]) == [1, 2]

def test_empty_lists():
    assert flatten([[], [[]], 5]) == [5]
