"""A seeded synthetic corpus whose parts give experts something to specialise on and the state something to keep.

One line = one exercise, all plain ASCII (one byte = one token):

    arithmetic   37+45=82 9*7=63 (3+4)*2=14      digits and operators; the answer depends on both operands
    recall       ka=41; key=7; mo=3; the red fox sees a box. 12+5=17 | key=7; ka=41;
                 pairs, filler, then after "|" the values again: the state must hold them until then
    brackets     ([a]{b(c)})                     closing the right bracket needs a stack of what is open
    words        the small cat sees a red box.   a small vocabulary and grammar

Token classes (`token_class`) let the bench ask whether routing follows them: digit, operator, letter,
bracket, space (anything else is "other").
"""

from __future__ import annotations

import random

WORDS = {
    "det": ["the", "a", "my", "one"],
    "adj": ["red", "small", "big", "old", "blue", "quick", "green", "tiny"],
    "noun": ["cat", "dog", "fox", "box", "tree", "bird", "ship", "key", "lamp", "hat"],
    "verb": ["sees", "finds", "likes", "moves", "takes", "draws", "holds", "wants"],
}
LETTERS = "abcdefghijklmnopqrstuvwxyz"
PARTS = ("arithmetic", "recall", "brackets", "words")
PART_WEIGHTS = (0.3, 0.3, 0.15, 0.25)
RECALL_MARK = "|"           # after it, every `key=` is followed by the value given before it

CLASSES = ("digit", "operator", "letter", "bracket", "space", "other")
_CLASS_OF = {**{c: "digit" for c in "0123456789"}, **{c: "operator" for c in "+-*/=<>"},
             **{c: "letter" for c in LETTERS + LETTERS.upper()}, **{c: "bracket" for c in "()[]{}"}, " ": "space"}


def token_class(token_id: int) -> int:
    """Index into CLASSES of a byte token (specials such as BOS are "other")."""
    name = _CLASS_OF.get(chr(token_id), "other") if 0 <= token_id < 128 else "other"
    return CLASSES.index(name)


def sentence(rng: random.Random) -> str:
    """'the small cat sees a red box.' from the small grammar above."""
    def phrase():
        adj = f"{rng.choice(WORDS['adj'])} " if rng.random() < 0.6 else ""
        return f"{rng.choice(WORDS['det'])} {adj}{rng.choice(WORDS['noun'])}"
    return f"{phrase()} {rng.choice(WORDS['verb'])} {phrase()}."


def equation(rng: random.Random) -> str:
    """One true equation: a+b, a-b (a >= b), a*b with small factors, or (a+b)*c."""
    kind = rng.random()
    if kind < 0.35:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return f"{a}+{b}={a + b}"
    if kind < 0.6:
        a, b = sorted((rng.randint(0, 99), rng.randint(0, 99)), reverse=True)
        return f"{a}-{b}={a - b}"
    if kind < 0.85:
        a, b = rng.randint(0, 12), rng.randint(0, 12)
        return f"{a}*{b}={a * b}"
    a, b, c = rng.randint(0, 9), rng.randint(0, 9), rng.randint(2, 5)
    return f"({a}+{b})*{c}={(a + b) * c}"


def brackets(rng: random.Random, depth: int = 0) -> str:
    """A balanced bracket string with a letter inside each innermost pair: '([a]{b(c)})'."""
    out = []
    for _ in range(rng.randint(1, 3 if depth else 2)):
        open_, close = rng.choice(("()", "[]", "{}"))
        inner = brackets(rng, depth + 1) if depth < 5 and rng.random() < 0.6 else rng.choice(LETTERS)
        out.append(open_ + inner + close)
    return "".join(out)


def filler(rng: random.Random, n_chars: int) -> str:
    """Sentences and equations, about n_chars long (never cut inside a word)."""
    out, size = [], 0
    while size < n_chars:
        piece = sentence(rng) if rng.random() < 0.6 else equation(rng)
        out.append(piece)
        size += len(piece) + 1
    return " ".join(out)


def random_key(rng: random.Random) -> str:
    return "key" if rng.random() < 0.1 else "".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 3)))


def recall_line(rng: random.Random, pairs: list[tuple[str, int]], filler_chars: int,
                queries: list[tuple[str, int]]) -> str:
    """'ka=41; key=7; <filler> | key=7; ka=41;' -- the values after the mark repeat the ones before it."""
    define = " ".join(f"{k}={v};" for k, v in pairs)
    ask = " ".join(f"{k}={v};" for k, v in queries)
    middle = f" {filler(rng, filler_chars)}" if filler_chars > 0 else ""
    return f"{define}{middle} {RECALL_MARK} {ask}"


def recall_pairs(rng: random.Random, n: int) -> list[tuple[str, int]]:
    keys: dict[str, int] = {}
    while len(keys) < n:
        keys.setdefault(random_key(rng), rng.randint(0, 99))
    return list(keys.items())


def sample_line(rng: random.Random) -> str:
    part = rng.choices(PARTS, PART_WEIGHTS)[0]
    if part == "arithmetic":
        return " ".join(equation(rng) for _ in range(rng.randint(2, 6)))
    if part == "recall":
        pairs = recall_pairs(rng, rng.randint(1, 4))
        queries = rng.sample(pairs, rng.randint(1, len(pairs)))
        return recall_line(rng, pairs, rng.choice((0, rng.randint(0, 60), rng.randint(0, 180))), queries)
    if part == "brackets":
        line = brackets(rng)
        while len(line) > 64:        # keep bracket lines about as long as the others
            line = brackets(rng)
        return line
    return " ".join(sentence(rng) for _ in range(rng.randint(1, 3)))


def sample_corpus(n_chars: int, seed: int) -> str:
    """Exactly n_chars of newline-separated exercises; the same seed gives the same text."""
    if n_chars < 0:
        raise ValueError(f"n_chars must be 0 or more, got {n_chars}.")
    rng = random.Random(seed)
    lines, size = [], 0
    while size < n_chars:
        lines.append(sample_line(rng))
        size += len(lines[-1]) + 1
    return "\n".join(lines)[:n_chars]
