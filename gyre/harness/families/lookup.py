"""``lookup``: the answer lives in the workspace, so the agent has to look.

Three kinds, from one to several tool calls:

- ``read``: "The file data/cedar.txt holds a code number. What is it?" (``cat`` it);
- ``find``: a key such as ``KQ7M`` is stored in one of 4-6 files of ``data/``, among other
  keys; "What number is stored under the key KQ7M?" (``grep -r``, maybe ``cat``);
- ``combine``: ``data/prices.txt`` and ``data/stock.txt`` list items; "What is the price of
  bolt times its count in stock?" (read both, then compute).

Every number is drawn at random (4-6 digits), so no reply gets it without reading the files.
The files travel in ``Problem.data["files"]`` (path -> text) and
:mod:`gyre.harness.families.write` puts them into the task's workspace. The verifier
checks the last ``Answer:`` line against the integer, as ``calc``'s does, with the same
reward rule (1 / 0.1 for the format with anything else / 0 without the line).
"""

from __future__ import annotations

import hashlib
import json
import random
import string

from .base import Problem, draw, score_integer_answer

_TAIL = " End your reply with a line of the form 'Answer: <number>'."
WORDS = (
    "amber", "birch", "cedar", "delta", "ember", "flint", "grove", "heron", "ivory", "juniper",
    "kelp", "lotus", "maple", "nectar", "onyx", "pearl", "quartz", "raven", "slate", "tulip",
)  # fmt: skip
ITEMS = ("bolt", "cable", "drill", "gear", "hinge", "lamp", "nail", "pipe", "screw", "valve")
KINDS = ("read", "find", "combine")


def _key(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(4))


def _read(rng: random.Random) -> tuple[str, dict[str, str], int]:
    word, value = rng.choice(WORDS), rng.randint(1000, 999_999)
    files = {f"data/{word}.txt": f"The code number is {value}.\n"}
    return f"The file data/{word}.txt holds a code number. What is it?", files, value


def _find(rng: random.Random) -> tuple[str, dict[str, str], int]:
    n_files, keys = rng.randint(4, 6), set[str]()
    files: dict[str, str] = {}
    for name in rng.sample(WORDS, n_files):
        lines = []
        for _ in range(rng.randint(3, 5)):
            k = _key(rng)
            while k in keys:
                k = _key(rng)
            keys.add(k)
            lines.append(f"{k} = {rng.randint(1000, 999_999)}")
        files[f"data/{name}.txt"] = "\n".join(lines) + "\n"
    path = rng.choice(sorted(files))
    key, _, value = rng.choice(files[path].splitlines()).partition(" = ")
    q = f"One of the files in data/ stores the key {key}. What number is stored under {key}?"
    return q, files, int(value)


def _combine(rng: random.Random) -> tuple[str, dict[str, str], int]:
    items = rng.sample(ITEMS, rng.randint(4, 6))
    price = {i: rng.randint(100, 9999) for i in items}
    stock = {i: rng.randint(10, 999) for i in items}
    order = rng.sample(items, len(items))  # the two files list the items in different orders
    files = {
        "data/prices.txt": "".join(f"{i}: {price[i]}\n" for i in items),
        "data/stock.txt": "".join(f"{i}: {stock[i]}\n" for i in order),
    }
    item = rng.choice(items)
    q = (
        f"data/prices.txt lists the price of each item and data/stock.txt how many are in "
        f"stock. What is the price of {item} times its count in stock?"
    )
    return q, files, price[item] * stock[item]


_MAKERS = {"read": _read, "find": _find, "combine": _combine}


def make(seed: int, split: str, n: int) -> list[Problem]:
    """``n`` distinct problems of ``split``, the three kinds in equal shares on average."""
    rng = random.Random(f"lookup-{seed}-{split}")

    def propose() -> Problem:
        kind = rng.choice(KINDS)
        question, files, value = _MAKERS[kind](rng)
        digest = hashlib.sha256(json.dumps([question, files], sort_keys=True).encode()).hexdigest()[
            :10
        ]
        return Problem(
            family="lookup",
            name=f"lookup-{kind}-{digest}",
            split=split,
            instruction=question + _TAIL,
            answer=str(value),
            data={"files": files, "kind": kind},
        )

    return draw(n, split, propose)


score = score_integer_answer  # the tool-use families' rule (base.py)
