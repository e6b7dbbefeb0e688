from intervals import merge


def test_unsorted():
    assert merge([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]
