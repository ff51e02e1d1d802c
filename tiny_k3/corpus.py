"""A seeded synthetic corpus whose parts give experts something to specialise on and the state something to keep.

One line = one exercise, all plain ASCII (one byte = one token):

    arithmetic   3+4=7 8+5=13 | 37+45=82 9*7=63 (3+4)*2=14   digits and operators; the answer depends on both
    recall       a=3; q=8; B=1; the red fox sees a box. 12+5=17 | q=8; a=3;
                 1-52 pairs (distinct keys a-z, A-Z; single digits), filler, then after "|" some keys again:
                 the state (or the KV cache) must hold the values until then
    brackets     ([a]{b(c)})                     closing the right bracket needs a stack of what is open
    words        the small cat sees a red box.   a small vocabulary and grammar
    copy         k3qa8z | k3qa8z                 (only where a training stage asks for them) a span, then the
                 same span again: the cleanest signal for an induction circuit, "find the earlier copy
                 of this token and say what came after it", which a softmax-only model must grow to recall

Token classes (`token_class`) let the bench ask whether routing follows them: digit, operator, letter,
bracket, space (anything else is "other").
"""

from __future__ import annotations

import random
import re

WORDS = {
    "det": ["the", "a", "my", "one"],
    "adj": ["red", "small", "big", "old", "blue", "quick", "green", "tiny"],
    "noun": ["cat", "dog", "fox", "box", "tree", "bird", "ship", "key", "lamp", "hat"],
    "verb": ["sees", "finds", "likes", "moves", "takes", "draws", "holds", "wants"],
}
LETTERS = "abcdefghijklmnopqrstuvwxyz"
KEYS = LETTERS + LETTERS.upper()   # recall keys: a-z then A-Z, 52 single bytes (a 32 x 32 state holds 32 exactly)
MAX_PAIRS = len(KEYS)
PARTS = ("arithmetic", "recall", "brackets", "words")
PART_WEIGHTS = (0.25, 0.45, 0.1, 0.2)
RECALL_MARK = "|"           # after it, every `key=` is followed by the value given before it
MAX_FILLER = 200            # longest filler (characters = tokens) between a recall line's definitions and queries
_VALUE = re.compile(r"=(\d+)")
_COPY = re.compile(r"^([a-z0-9]+) \| ([a-z0-9]+)$")
# A recall line's definitions at the start of a line, up to the last ';' ('a=3; q=8;', recall_line), over bytes
DEFINITIONS = re.compile(rb"^(?:[A-Za-z]=[0-9]; )*[A-Za-z]=[0-9];", re.MULTILINE)

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


def recall_pairs(rng: random.Random, n: int) -> list[tuple[str, int]]:
    """n distinct single-letter keys with single-digit values: [("q", 8), ("A", 3), ...] (n <= 52).

    Up to 26 pairs the keys are lowercase letters, as in every line before the keys grew; past 26 they are
    drawn from all 52 (a-z, A-Z): past 32 orthogonal keys a 32 x 32 delta-rule state can no longer be exact,
    while a cache keeps every pair."""
    if not 1 <= n <= MAX_PAIRS:
        raise ValueError(f"a recall line holds 1 to {MAX_PAIRS} pairs (one per key a-z, A-Z), got {n}.")
    return [(key, rng.randint(0, 9)) for key in rng.sample(LETTERS if n <= len(LETTERS) else KEYS, n)]


def recall_line(rng: random.Random, pairs: list[tuple[str, int]], filler_chars: int,
                queries: list[tuple[str, int]]) -> str:
    """'a=3; q=8; <filler> | q=8; a=3;' -- the values after the mark repeat the ones before it."""
    define = " ".join(f"{k}={v};" for k, v in pairs)
    ask = " ".join(f"{k}={v};" for k, v in queries)
    middle = f" {filler(rng, filler_chars)}" if filler_chars > 0 else ""
    return f"{define}{middle} {RECALL_MARK} {ask}"


def sum_line(rng: random.Random) -> str:
    """Single-digit sums, the arithmetic the default prompt and the lessons show: '3+4=7 8+5=13'."""
    return " ".join(f"{a}+{b}={a + b}" for a, b in ((rng.randint(0, 9), rng.randint(0, 9))
                                                      for _ in range(rng.randint(2, 6))))


COPY_CHARS = LETTERS + "0123456789"


def copy_line(rng: random.Random, min_len: int = 4, max_len: int = 24) -> str:
    """'k3qa8z | k3qa8z': a random span of letters and digits, the mark, then the span again."""
    span = "".join(rng.choice(COPY_CHARS) for _ in range(rng.randint(min_len, max_len)))
    return f"{span} {RECALL_MARK} {span}"


def sample_line(rng: random.Random, max_filler: int = MAX_FILLER, recall_share: float | None = None,
                max_pairs: int = len(LETTERS), copy_share: float = 0.0, many_share: float = 0.15,
                ask_all: bool = False) -> str:
    """One exercise; recall lines carry 0..max_filler characters of filler between definitions and queries
    and 1..max_pairs pairs. recall_share overrides the share of recall lines (the rest keep their proportions);
    copy_share > 0 makes that share of all lines copy lines (copy_line), drawn before anything else.
    many_share: the share of recall lines with more than 6 pairs (7..max_pairs); a line of more than 26 pairs
    asks up to all of its keys and keeps its filler under 32 characters, so that it fits a row whole.
    ask_all: every recall line asks all of its keys (in a random order), as a probe does."""
    if copy_share and rng.random() < copy_share:
        return copy_line(rng)
    weights = PART_WEIGHTS if recall_share is None else tuple(
        recall_share if p == "recall" else w * (1 - recall_share) / (1 - PART_WEIGHTS[1])
        for p, w in zip(PARTS, PART_WEIGHTS))
    part = rng.choices(PARTS, weights)[0]
    if part == "arithmetic":
        if rng.random() < 0.5:
            return sum_line(rng)
        return " ".join(equation(rng) for _ in range(rng.randint(2, 6)))
    if part == "recall":
        # mostly a few pairs (what a state of 2 x 32 x 32 can hold), sometimes many (what only attention can)
        n = (rng.randint(1, min(6, max_pairs)) if rng.random() >= many_share or max_pairs <= 6
             else rng.randint(7, max_pairs))
        pairs = recall_pairs(rng, n)
        asked = len(pairs) if ask_all else rng.randint(1, min(len(pairs), 8 if n <= len(LETTERS) else n))
        queries = rng.sample(pairs, asked)
        filler_chars = 0 if rng.random() < 0.15 else rng.randint(0, max_filler if n <= len(LETTERS) else 32)
        return recall_line(rng, pairs, filler_chars, queries)
    if part == "brackets":
        line = brackets(rng)
        while len(line) > 64:        # keep bracket lines about as long as the others
            line = brackets(rng)
        return line
    return " ".join(sentence(rng) for _ in range(rng.randint(1, 3)))


def answer_mask(text: str) -> bytearray:
    """1 at every byte whose value follows from the line before it, else 0 (one entry per byte of text).

    Answers are the digits after "=" in an equation (the byte before "=" is a digit or ")") and the
    values of the queries after RECALL_MARK; a definition's value ("a=3" before the mark) is a free
    choice, so it is not an answer. In a copy line the span after the mark is an answer, except its first
    byte (nothing before it says where the copy starts). Training weights these bytes up (tiny_k3.train).
    """
    mask = bytearray(len(text))
    offset = 0
    for line in text.split("\n"):
        mark = line.find(RECALL_MARK)
        copy = _COPY.match(line)
        if copy and copy.group(1) == copy.group(2):
            mask[offset + copy.start(2) + 1:offset + copy.end(2)] = b"\x01" * (len(copy.group(2)) - 1)
        for m in _VALUE.finditer(line):
            before = line[m.start() - 1] if m.start() else ""
            if before.isdigit() or before == ")" or (mark != -1 and m.start() > mark):
                mask[offset + m.start(1):offset + m.end(1)] = b"\x01" * (m.end(1) - m.start(1))
        offset += len(line) + 1
    return mask


def sample_corpus(n_chars: int, seed: int, max_filler: int = MAX_FILLER, recall_share: float | None = None,
                  max_pairs: int = len(LETTERS), copy_share: float = 0.0, many_share: float = 0.15,
                  ask_all: bool = False) -> str:
    """Exactly n_chars of newline-separated exercises; the same seed (and settings) gives the same text."""
    if n_chars < 0:
        raise ValueError(f"n_chars must be 0 or more, got {n_chars}.")
    rng = random.Random(seed)
    lines, size = [], 0
    while size < n_chars:
        lines.append(sample_line(rng, max_filler, recall_share, max_pairs, copy_share, many_share, ask_all))
        size += len(lines[-1]) + 1
    return "\n".join(lines)[:n_chars]
