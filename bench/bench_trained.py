"""What training bought: the shipped checkpoints against fresh weights, and the ablations against them.

    python bench/bench_trained.py [--rows 48] [--lines 48] [--ablation-steps 200] [--runs bench/results]

1. Held-out loss (nats per byte) of the trained hybrid and its all-softmax twin vs fresh weights.
2. Expert specialisation: mutual information I(class; expert) in bits between a token's class (digit,
   operator, letter, bracket, space) and each expert it is routed to, per MoE layer, trained vs fresh;
   and the load balance: coefficient of variation (std / mean) of the tokens per expert, with the bias
   updates and without them: two short runs trained here with the same seed, steps and data. Then the load CV
   of each shipped model on three texts (the held-out text, the shipped recipe's last stage, recall lines alone),
   and with `--small-from COMMIT ...` of the `small` checkpoints those commits shipped (read with git show).
3. Recall: "a=3; q=8; <filler> | q=8; a=3;" (tiny_k3.recall, teacher forced, chance 10 %): exact recall of
   2 pairs per distance for the three shipped models and fresh weights (bench_recall.py has the full tables).
4. Attention Residuals (block) vs the standard residual: held-out loss curves of short runs trained here
   with the same seed, steps and data; and, when `--runs` holds them, the logs of full-schedule runs
   (python -m tiny_k3.train --preset small --steps 2000 --seed 0 --threads 1 --out runs --residual standard,
   logged beside small.log; the logs of the shipped runs are kept in bench/results/).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import re
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tiny_k3 import K3Config, TinyK3  # noqa: E402
from tiny_k3.corpus import CLASSES, token_class  # noqa: E402
from tiny_k3.recall import make_probes, recall_accuracy  # noqa: E402
from tiny_k3.probe import Event, MoEEvent, Recorder  # noqa: E402
from tiny_k3.data import Stage  # noqa: E402
from tiny_k3.recipes import CURRICULUM  # noqa: E402
from tiny_k3.train import EVAL_SEED, corpus_rows, evaluate, train  # noqa: E402
from tiny_k3.weights import stored_config  # noqa: E402
from provenance import provenance_line  # noqa: E402

KEPT_CLASSES = [CLASSES.index(c) for c in ("digit", "operator", "letter", "bracket", "space")]


class RoutingLog(Recorder):
    """Keeps the chosen expert ids [B, T, k] of every MoE layer."""

    def __init__(self):
        self.ids: dict[int, list[torch.Tensor]] = {}

    def on(self, event: Event) -> None:
        if isinstance(event, MoEEvent):
            self.ids.setdefault(event.layer, []).append(event.expert_ids)


@torch.no_grad()
def routing(model: TinyK3, rows: torch.Tensor, batch: int = 8) -> dict[int, torch.Tensor]:
    """layer -> expert ids [N, T, k] for the input tokens rows[:, :-1]."""
    log = RoutingLog()
    for i in range(0, len(rows), batch):
        model(rows[i:i + batch, :-1], recorder=log)
    return {layer: torch.cat(ids) for layer, ids in log.ids.items()}


def mutual_information(classes: torch.Tensor, ids: torch.Tensor, num_experts: int) -> float:
    """I(C; E) in bits over (token, slot) pairs; classes [N, T], ids [N, T, k]; only KEPT_CLASSES count."""
    keep = torch.isin(classes, torch.tensor(KEPT_CLASSES))
    c = classes[keep].repeat_interleave(ids.shape[-1])
    e = ids[keep].reshape(-1)
    joint = torch.bincount(c * num_experts + e, minlength=len(CLASSES) * num_experts).double()
    p = (joint / joint.sum()).view(len(CLASSES), num_experts)
    outer = p.sum(1, keepdim=True) * p.sum(0, keepdim=True)
    nz = p > 0
    return float((p[nz] * (p[nz] / outer[nz]).log2()).sum())


def class_entropy(classes: torch.Tensor) -> float:
    c = classes[torch.isin(classes, torch.tensor(KEPT_CLASSES))]
    p = torch.bincount(c).double()
    p = p[p > 0] / p.sum()
    return float(-(p * p.log2()).sum())


def load_cv(ids: torch.Tensor, num_experts: int) -> float:
    load = torch.bincount(ids.reshape(-1), minlength=num_experts).double()
    return float(load.std(unbiased=False) / load.mean())


def small_at(commit: str) -> TinyK3:
    """The `small` checkpoint a commit shipped (git show COMMIT:tiny_k3/weights/small.safetensors), in its own
    config."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    blob = subprocess.run(["git", "show", f"{commit}:tiny_k3/weights/small.safetensors"], capture_output=True,
                          check=True, cwd=pathlib.Path(__file__).resolve().parents[1]).stdout
    with tempfile.NamedTemporaryFile(suffix=".safetensors") as f:
        f.write(blob)
        f.flush()
        with safe_open(f.name, framework="pt") as handle:
            config = stored_config(handle.metadata() or {})
        model = TinyK3(config)
        model.load_state_dict({k: v.float() for k, v in load_file(f.name).items()})
    return model.eval()


def load_by_text(models: dict[str, TinyK3], texts: dict[str, torch.Tensor]) -> None:
    """Print each model's load CV (its mean over the MoE layers) on each text."""
    print("   " + f"{'model':<26}" + "".join(f"{name:>20}" for name in texts))
    for name, model in models.items():
        E = model.config.num_experts
        cvs = []
        for rows in texts.values():
            per_layer = [load_cv(ids, E) for ids in routing(model, rows).values()]
            cvs.append(sum(per_layer) / len(per_layer))
        print(f"   {name:<26}" + "".join(f"{c:>20.2f}" for c in cvs))


def short_run(config: K3Config, steps: int, **kw):
    return train(config, steps, 0, eval_every=max(1, steps // 4), progress=False, log=lambda msg: None, **kw)


def logged_curve(path: pathlib.Path) -> dict[int, float]:
    """step -> held-out loss from a `python -m tiny_k3.train` log."""
    if not path.exists():
        return {}
    found = re.findall(r"step (\d+)/\d+: train [\d.]+  held-out ([\d.]+)", path.read_text())
    return {int(step): float(loss) for step, loss in found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=48, help="held-out rows of 256 tokens")
    parser.add_argument("--lines", type=int, default=48, help="recall probes per distance")
    parser.add_argument("--ablation-steps", type=int, default=200, help="steps of each short ablation run (0: skip)")
    parser.add_argument("--runs", default="bench/results", help="folder with logs/*.log or *.log of full-schedule runs")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--small-from", nargs="*", default=[], metavar="COMMIT",
                        help="also the small checkpoints these commits shipped, in the load-by-text table")
    args = parser.parse_args()
    print(provenance_line())
    torch.set_num_threads(args.threads)

    shipped = {name: TinyK3.from_pretrained(name).eval() for name in ("small", "small-twin", "small-kda")}
    hybrid, twin = shipped["small"], shipped["small-twin"]
    torch.manual_seed(0)
    fresh = {name: TinyK3(model.config).eval() for name, model in shipped.items()}
    rows = corpus_rows(args.rows, 256, EVAL_SEED)                  # the held-out text of tiny_k3.train
    E = hybrid.config.num_experts

    print(f"1. held-out loss, nats/byte ({len(rows)} rows x 256 tokens of unseen text; ln 512 = {math.log(512):.2f})")
    for name, model in shipped.items():
        print(f"   {name:<22} trained {evaluate(model, rows):.3f}   fresh {evaluate(fresh[name], rows):.3f}")

    short = {}
    if args.ablation_steps:
        n = args.ablation_steps
        print(f"\n   training short ablations: {n} steps each, seed 0, same data ...", flush=True)
        short["bias"] = short_run(hybrid.config, n)
        short["no bias"] = short_run(hybrid.config, n, bias_update=False)
        short["standard"] = short_run(hybrid.config.replace(residual="standard", name="small-standard"), n)

    tokens = rows.tokens                                          # [N, 257]: BOS + 256 bytes
    classes = tokens[:, :-1].clone().apply_(token_class)
    print(f"\n2. routing on the same text: I(class; expert) in bits (H(class) = {class_entropy(classes):.2f} bits, "
          f"5 classes) and load CV (std/mean of tokens per expert; 0 = perfectly even)")
    traces = {"shipped": routing(hybrid, tokens), "fresh": routing(fresh["small"], tokens)}
    for key in ("bias", "no bias"):
        if key in short:
            traces[f"{args.ablation_steps}st {key}"] = routing(short[key].model.eval(), tokens)
    print("   layer" + "".join(f"{'MI ' + k:>17}" for k in traces))
    for layer in traces["shipped"]:
        print(f"   {layer:>5}" + "".join(f"{mutual_information(classes, t[layer], E):>17.3f}" for t in traces.values()))
    print("   layer" + "".join(f"{'CV ' + k:>17}" for k in traces))
    for layer in traces["shipped"]:
        print(f"   {layer:>5}" + "".join(f"{load_cv(t[layer], E):>17.3f}" for t in traces.values()))
    texts = {"held-out text": tokens,
             "last stage's lines": corpus_rows(args.rows, 256, EVAL_SEED,
                                               dataclasses.replace(CURRICULUM[-1], seq_len=256)).tokens,
             "recall lines alone": corpus_rows(args.rows, 256, EVAL_SEED,
                                               Stage(recall_share=1.0, max_filler=16, max_pairs=16)).tokens}
    print("   load CV by text (mean over the MoE layers): the bias balances the load of the rows a model trains on")
    load_by_text({**shipped, **{f"small at {c}": small_at(c) for c in args.small_from}}, texts)
    best = max(traces["shipped"], key=lambda l: mutual_information(classes, traces["shipped"][l], E))
    ids = traces["shipped"][best]
    print(f"   shipped layer {best}: each class's favourite expert, the share of that class's tokens that pick it"
          f" and of the other tokens")
    for c in KEPT_CLASSES:
        chosen = ids[classes == c]                                   # [n, k]
        top = torch.bincount(chosen.reshape(-1), minlength=E).argmax()
        share = (chosen == top).any(-1).float().mean()
        others = (ids[(classes != c)] == top).any(-1).float().mean()
        print(f"     {CLASSES[c]:<9} expert {int(top):>3}: {share:6.1%} vs {others:6.1%}")

    print("\n3. recall: exact recall of 2 pairs (teacher-forced argmax of each asked value; chance 10 %)")
    print(f"   {'filler':>8}" + "".join(f"{name:>12}" for name in shipped) + f"{'fresh':>12}")
    for filler_chars in (0, 32, 128, 512):
        probes = make_probes(args.lines, 2, filler_chars, seed=1000 + filler_chars)
        acc = [recall_accuracy(m, probes) for m in (*shipped.values(), fresh["small"])]
        print(f"   {filler_chars:>8}" + "".join(f"{a:>12.0%}" for a in acc))

    print("\n4. Attention Residuals (block) vs the standard residual, same seed, steps and data: held-out loss")
    if short:
        a, b = short["bias"], short["standard"]
        print(f"   short runs ({args.ablation_steps} steps):  step " + " ".join(f"{s:>6}" for s in a.eval_steps))
        print("      block AttnRes                  " + " ".join(f"{x:>6.3f}" for x in a.eval_loss))
        print("      standard residual              " + " ".join(f"{x:>6.3f}" for x in b.eval_loss))
    logs = pathlib.Path(args.runs) / "logs" if (pathlib.Path(args.runs) / "logs").is_dir() else pathlib.Path(args.runs)
    block, standard = logged_curve(logs / "small.log"), logged_curve(logs / "small-standard.log")
    steps = sorted(set(block) & set(standard))
    if steps:
        print("   full schedule (2000-step cosine), step " + " ".join(f"{s:>6}" for s in steps))
        print("      block AttnRes                  " + " ".join(f"{block[s]:>6.3f}" for s in steps))
        print("      standard residual              " + " ".join(f"{standard[s]:>6.3f}" for s in steps))
    else:
        print(f"   (no full-schedule logs in {logs}: small.log and small-standard.log, the same recipe with "
              "--residual standard, are both needed)")


if __name__ == "__main__":
    main()
