import pytest
from stack import Stack


def test_peek():
    s = Stack(); s.push(1); s.push(2)
    assert s.peek() == 2

def test_pop_empty():
    with pytest.raises(IndexError):
        Stack().pop()
