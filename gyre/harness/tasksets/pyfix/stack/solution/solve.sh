#!/usr/bin/env bash
# Reference solution (Harbor's oracle): write the fixed module.
cat > stack.py <<'GYRE_EOF'
class Stack:
    def __init__(self):
        self._items = []

    def push(self, x):
        self._items.append(x)

    def pop(self):
        if not self._items:
            raise IndexError("pop from empty stack")
        return self._items.pop()

    def peek(self):
        if not self._items:
            raise IndexError("peek at empty stack")
        return self._items[-1]

    def __len__(self):
        return len(self._items)
GYRE_EOF
