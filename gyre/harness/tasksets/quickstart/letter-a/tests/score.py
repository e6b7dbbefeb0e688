"""Quickstart verifier: the fraction of answer characters that satisfy the task's predicate.

Dense on purpose: every answer gets a graded reward in [0, 1], so a group of
attempts from even a randomly initialised model has reward differences to learn from.
"""
import json
import os
import sys

PREDICATES = {
    "letter-a": lambda c: c == "a",
    "digits": lambda c: c.isdigit(),
    "vowels": lambda c: c in "aeiou",
    "upper": lambda c: c.isupper(),
}

def main() -> int:
    kind = sys.argv[1]
    pred = PREDICATES[kind]
    path = os.path.join(os.environ["GYRE_WORKSPACE"], "answer.txt")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    chars = [c for c in text if not c.isspace()][:200]
    reward = sum(1 for c in chars if pred(c)) / len(chars) if chars else 0.0
    with open(os.path.join(os.environ["GYRE_REWARD_DIR"], "reward.json"), "w") as f:
        json.dump({"reward": reward}, f)
    return 0

if __name__ == "__main__":
    sys.exit(main())
