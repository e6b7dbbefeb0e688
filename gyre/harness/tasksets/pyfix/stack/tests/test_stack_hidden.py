import pytest
from stack import Stack


def test_peek():
    s = Stack(); s.push(1); s.push(2)
    assert s.peek() == 2

def test_pop_empty():
    with pytest.raises(IndexError):
        Stack().pop()

def test_peek_empty():
    with pytest.raises(IndexError):
        Stack().peek()

def test_lifo():
    s = Stack()
    for i in range(3):
        s.push(i)
    assert [s.pop(), s.pop(), s.pop()] == [2, 1, 0]
    assert len(s) == 0
