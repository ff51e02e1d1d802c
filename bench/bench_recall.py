"""Does the memory work? In-context recall of the shipped small (hybrid), small-twin (all MLA), small-kda (all KDA).

    python bench/bench_recall.py [--probes 32] [--threads 2]

Probes are lines "a=3; q=8; <filler> | q=8; a=3;" (tiny_k3.recall), every value after "|" scored
teacher-forced: the argmax after "q=" must be the digit defined before the mark. Chance is 10 %.

0. single-digit sums "a+b=" answered right (all 100 of them), at a line start and after another equation;
1. exact recall vs number of pairs (1, 2, 4, 8, 16, 26) at a short distance (16 tokens of filler);
2. exact recall vs distance (0, 32, 128, 512, 1024 tokens of filler) at 2 pairs;
3. the decode cache each model held at the first query (bytes, measured from the live cache), beside 1 and 2;
4. where recall lives: the hybrid with its MLA layers unable to attend to the definitions (their latent
   rows dropped: exact masking under NoPE) vs with every KDA state reset just before the queries; and
   small-kda with each KDA layer's state reset in turn.
All numbers are measured in this one run on the stored bfloat16 weights (cast to float32).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tiny_k3 import TinyK3  # noqa: E402
from tiny_k3.cache import KDAState  # noqa: E402
from tiny_k3.tokenizer import encode  # noqa: E402
from tiny_k3.recall import (edited_recall_accuracy, hide_definitions_from_mla, make_probes,  # noqa: E402
                            reset_kda_states)

MODELS = ("small", "small-twin", "small-kda")
PAIRS = (1, 2, 4, 8, 16, 26)
DISTANCES = (0, 32, 128, 512, 1024)
SHORT = 16


@torch.no_grad()
def sum_accuracy(model: TinyK3, context: str = "") -> float:
    """All 100 single-digit sums "a+b=" (after `context`): the share whose whole result is the argmax,
    digit by digit, teacher forced."""
    hits = []
    for a in range(10):
        for b in range(10):
            prefix, answer = encode(f"{context}{a}+{b}="), str(a + b)
            ids = torch.tensor([prefix + list(answer.encode())])
            logits, _ = model(ids[:, :-1])
            predicted = logits[0, len(prefix) - 1:].argmax(-1)
            hits.append(bool((predicted == ids[0, len(prefix):]).all()))
    return sum(hits) / len(hits)


@torch.no_grad()
def cache_bytes_at_query(model: TinyK3, probes) -> int:
    """Mean bytes of the decode cache (KV + states) after reading a probe up to its first query."""
    sizes = [model(p.tokens[None, :p.query_start])[1].nbytes() for p in probes]
    return round(sum(sizes) / len(sizes))


def row(label: str, cells: list[str], width: int = 9) -> str:
    return f"{label:<14}" + "".join(f"{c:>{width}}" for c in cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--probes", type=int, default=32, help="probe lines per cell")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.probes} probes per cell, chance 10%")
    start = time.perf_counter()
    models = {name: TinyK3.from_pretrained(name).eval() for name in MODELS}

    print("\n0. single-digit sums a+b= (all 100), whole result right, at a line start / after '12+5=17 '")
    for name, model in models.items():
        print(row(name, [f"{sum_accuracy(model):.0%}", f"{sum_accuracy(model, '12+5=17 '):.0%}"]))

    print(f"\n1. exact recall vs pairs, {SHORT} tokens of filler   (cache bytes at the first query)")
    print(row("pairs", [str(n) for n in PAIRS]))
    for name, model in models.items():
        cells, sizes = [], []
        for n in PAIRS:
            probes = make_probes(args.probes, n, SHORT, seed=100 + n)
            cells.append(f"{edited_recall_accuracy(model, probes):.0%}")
            sizes.append(f"{cache_bytes_at_query(model, probes[:4]) / 1024:.0f}K")
        print(row(name, cells))
        print(row("  cache", sizes))

    print("\n2. exact recall vs distance (tokens of filler), 2 pairs   (cache bytes at the first query)")
    print(row("distance", [str(d) for d in DISTANCES]))
    for name, model in models.items():
        cells, sizes = [], []
        for d in DISTANCES:
            probes = make_probes(args.probes, 2, d, seed=200 + d)
            cells.append(f"{edited_recall_accuracy(model, probes):.0%}")
            sizes.append(f"{cache_bytes_at_query(model, probes[:4]) / 1024:.0f}K")
        print(row(name, cells))
        print(row("  cache", sizes))

    print(f"\n3. where the recall lives (2 and 4 pairs, {SHORT} and 128 tokens of filler)")
    settings = [(2, SHORT), (4, SHORT), (2, 128), (4, 128)]
    print(row("pairs/filler", [f"{n}/{d}" for n, d in settings], 10))
    hybrid = models["small"]
    edits = {"intact": None, "MLA blind": hide_definitions_from_mla, "KDA reset": reset_kda_states()}
    for label, edit in edits.items():
        print(row(f"small {label}", [f"{edited_recall_accuracy(hybrid, make_probes(args.probes, n, d, 300 + n + d), edit):.0%}"
                                     for n, d in settings], 10))
    kda = models["small-kda"]
    kda_layers = [i for i, b in enumerate(kda.blocks) if b.kind == "kda"]
    print(row("small-kda", [f"{edited_recall_accuracy(kda, make_probes(args.probes, n, d, 300 + n + d)):.0%}"
                            for n, d in settings], 10))
    for layer in kda_layers:
        edit = reset_kda_states({layer})
        print(row(f"  reset L{layer}", [f"{edited_recall_accuracy(kda, make_probes(args.probes, n, d, 300 + n + d), edit):.0%}"
                                        for n, d in settings], 10))
    state = sum(c.nbytes() for c in kda(make_probes(1, 1, 0, 0)[0].tokens[None])[1].layers if isinstance(c, KDAState))
    print(f"\nsmall-kda's whole memory is {state / 1024:.0f} KiB of KDA state, whatever the context length.")
    print(f"measured in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
