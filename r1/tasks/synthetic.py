"""Synthetic arithmetic word problems: the default task, needing no download.

A problem is a short story about one person's collection that changes `level` times (gets more, gives
some away, grows k-fold, splits into k equal piles); the question asks how many are left. Level 1 is one
operation on numbers up to 20; level L >= 2 chains L operations from numbers up to 10**L. Every
intermediate and the answer are positive integers. Rows have GSM8K's schema and solution format
(`<<7+5=12>>` annotations, a final `#### 12`), so GSM8K's prompt, reward and expert chats apply unchanged
and are imported from there. Row i draws from its own RNG seeded with (seed, level, i): the same
whatever n is, independent of PYTHONHASHSEED and of the machine.
"""

import random

from r1.tasks.gsm8k import expert_messages, make_prompt, score  # noqa: F401  (same formats: re-exported)

MAX_LEVEL = 8
NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira", "Liam")
ITEMS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "shells", "cookies", "stamps", "cards")


def make_dataset(n: int, seed: int, level: int) -> list[dict]:
    """n problems of one level, deterministic for (seed, level)."""
    if type(n) is not int or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if type(seed) is not int:
        raise ValueError(f"seed must be an int, got {seed!r}")
    if type(level) is not int or not 1 <= level <= MAX_LEVEL:
        raise ValueError(f"level must be an int from 1 to {MAX_LEVEL}, got {level!r}")
    return [make_row(seed, level, index) for index in range(n)]


def make_row(seed: int, level: int, index: int) -> dict:
    rng = random.Random(f"synthetic:{seed}:{level}:{index}")
    high = 20 if level == 1 else 10**level
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    value = rng.randint(2, high)
    story = [f"{name} has {value} {item}."]
    lines = [f"{name} starts with {value} {item}."]
    for _ in range(level):
        divisors = [k for k in range(2, 13) if value % k == 0 and value // k >= 2]
        ops = ["add", "mul"] + (["sub"] if value >= 3 else []) + (["div"] if divisors else [])
        op = rng.choice(ops)
        if op == "add":
            k = rng.randint(1, high)
            new, sign = value + k, "+"
            story.append(f"Then {name} gets {k} more {item}.")
            lead = f"After getting {k} more, {name} has"
        elif op == "sub":
            k = rng.randint(1, value - 2)
            new, sign = value - k, "-"
            story.append(f"Then {name} gives away {k} {item}.")
            lead = f"After giving away {k}, {name} has"
        elif op == "mul":
            k = rng.randint(2, 2 + level)
            new, sign = value * k, "*"
            story.append(f"Then {name}'s collection grows to {k} times its size.")
            lead = f"Growing {k}-fold, the collection has"
        else:
            k = rng.choice(divisors)
            new, sign = value // k, "/"
            story.append(f"Then {name} splits the {item} into {k} equal piles and keeps one pile.")
            lead = f"One of {k} equal piles holds"
        lines.append(f"{lead} {value}{sign}{k} = <<{value}{sign}{k}={new}>>{new} {item}.")
        value = new
    story.append(f"How many {item} does {name} have now?")
    lines.append(f"#### {value}")
    return {"id": f"synthetic-L{level}-{seed}-{index}", "question": " ".join(story),
            "answer": str(value), "solution": "\n".join(lines)}
