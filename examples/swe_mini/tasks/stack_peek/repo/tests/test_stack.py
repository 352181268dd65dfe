import pytest
from structs import Stack


def test_push_pop():
    s = Stack()
    s.push(1)
    s.push(2)
    assert s.pop() == 2
    assert len(s) == 1


def test_peek_returns_top():
    s = Stack()
    s.push("a")
    s.push("b")
    assert s.peek() == "b"
    assert len(s) == 2


def test_peek_empty_raises_index_error():
    with pytest.raises(IndexError, match="empty"):
        Stack().peek()
