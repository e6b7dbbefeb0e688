class Stack:
    def __init__(self):
        self._items = []

    def push(self, x):
        self._items.append(x)

    def pop(self):
        if self._items:
            return self._items.pop()
        return None

    def peek(self):
        return self._items[0]

    def __len__(self):
        return len(self._items)
