"""The command line of `python -m tiny_k3.train` (tiny_k3/train.py): its flags, and the curriculum and config
changes they make."""

from __future__ import annotations

import argparse
import dataclasses
import json

from .config import K3Config
from .data import BLIND_WINDOW, Stage
from .recipes import ANSWER_WEIGHT, CURRICULA, QK_GAIN, binding_from, with_mla_blind


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tiny_k3.train", description="Train a tiny K3 on the synthetic corpus; this is what makes the shipped checkpoints.")
    parser.add_argument("--preset", default="small", help="a preset name, or <preset>-twin for its all-softmax twin")
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs", help="directory for <name>.safetensors and <name>.json")
    parser.add_argument("--name", default=None, help="file name (default: the config name)")
    parser.add_argument("--batch", type=int, default=None, help="rows per step (default: each stage's)")
    parser.add_argument("--seq-len", type=int, default=None, help="bytes per row (default: each stage's)")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: min(100, steps / 10))")
    parser.add_argument("--curriculum", choices=sorted(CURRICULA), default="plain",
                        help="the stages of recall lines (tiny_k3/recipes.py; the shipped recipe: scaffold-first, "
                             "with --scaffold 200,100)")
    parser.add_argument("--stages", type=int, default=None,
                        help="train on the curriculum's first STAGES stages only, the steps split among them "
                             "(a probe of an early stage at length)")
    parser.add_argument("--mla-blind-share", type=float, default=None,
                        help=f"share of steps on which the MLA layers see only their last {BLIND_WINDOW} keys, on "
                             "every stage that is not memoryless (Stage.mla_blind_share; a hybrid only)")
    parser.add_argument("--bind-from", type=int, default=None, metavar="STAGE",
                        help="from this 0-based stage on, --hidden-share of the steps hidden and the states wiped at "
                             "--forget-share of the recall marks, with layer 0's KDA mixer re-initialised at its "
                             "first step (recipes.binding_from; a hybrid only)")
    parser.add_argument("--hidden-share", default="0.5", metavar="SHARE[,SHARE...]",
                        help="with --bind-from (Stage.hidden_share): one share, or one per bound stage in order, "
                             "the last for the stages after it")
    parser.add_argument("--forget-share", default="0.5", metavar="SHARE[,SHARE...]",
                        help="with --bind-from (Stage.forget_share), as --hidden-share")
    parser.add_argument("--fresh-heads", default=None, metavar="HEAD[,HEAD...]",
                        help="with --bind-from: re-initialise only these heads of layer 0's KDA mixer (Stage.fresh_kda_heads)")
    parser.add_argument("--qk-gain", type=float, default=QK_GAIN,
                        help="multiply MLA attention logits at init by this (scale_attention_logits_at_init)")
    parser.add_argument("--answer-weight", type=float, default=ANSWER_WEIGHT,
                        help="loss weight of recalled values and sums' results")
    parser.add_argument("--residual", choices=("block", "full", "standard"), default=None,
                        help="override the preset's residual (an ablation, not a shipped preset)")
    parser.add_argument("--no-bias-update", action="store_true", help="ablation: never move the router bias")
    parser.add_argument("--mla-conv", action="store_true",
                        help="ablation: KDA's short conv in front of the preset's own MLA layers too (mla_conv_layers)")
    parser.add_argument("--scaffold", default=None, metavar="GROW,FADE",
                        help="grow the first MLA layer's look-up on a scaffold that comes down (tiny_k3/scaffold.py)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="ablation: change one K3Config field, VALUE read as JSON (e.g. mla_rope=true, "
                             "'layer_kinds=[\"mla\",\"kda\",\"kda\",\"kda\",\"kda\",\"kda\",\"kda\",\"mla\"]'); repeatable")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--device", default=None)
    parser.add_argument("--compile", action="store_true",
                        help="run the compiled ops (tiny_k3/compiled.py, as TINY_K3_COMPILE=1): faster steps after a compile")
    return parser


def config_changes(settings: list[str]) -> dict:
    """["FIELD=VALUE", ...] (train --set) -> {field: value}: VALUE read as JSON where it parses (a list becomes
    a tuple), else kept as text. A field K3Config does not have is a one-line ValueError naming the fields."""
    fields = {f.name for f in dataclasses.fields(K3Config)}
    changes = {}
    for setting in settings:
        name, sep, text = setting.partition("=")
        if not sep or name not in fields:
            raise ValueError(f"--set takes FIELD=VALUE with FIELD one of K3Config's fields ({', '.join(sorted(fields))}), "
                             f"got {setting!r}.")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        changes[name] = tuple(value) if isinstance(value, list) else value
    return changes


def curriculum_of(args: argparse.Namespace) -> tuple[Stage, ...]:
    """The stages that --curriculum names, cut to the first --stages of them where given, with --mla-blind-share
    (where given) on every stage that is not memoryless, and the binding from --bind-from on (where given)."""
    stages = CURRICULA[args.curriculum]
    if args.mla_blind_share is not None:
        if not 0.0 <= args.mla_blind_share <= 1.0:
            raise ValueError(f"--mla-blind-share must lie in [0, 1], got {args.mla_blind_share}.")
        stages = with_mla_blind(stages, args.mla_blind_share)
    if args.bind_from is not None:
        if not 0 <= args.bind_from < len(stages):
            raise ValueError(f"--bind-from must name one of the {len(stages)} stages of {args.curriculum!r} "
                             f"(0 to {len(stages) - 1}), got {args.bind_from}.")
        try:
            heads = () if args.fresh_heads is None else tuple(int(h) for h in args.fresh_heads.split(","))
        except ValueError:
            raise ValueError(f"--fresh-heads takes head numbers, one or a comma list (e.g. 1), got {args.fresh_heads!r}.")
        stages = binding_from(stages, args.bind_from, hidden=shares("--hidden-share", args.hidden_share),
                              forget=shares("--forget-share", args.forget_share), heads=heads)
    if args.stages is None:
        return stages
    if not 1 <= args.stages <= len(stages):
        raise ValueError(f"--stages must lie between 1 and the {len(stages)} stages of {args.curriculum!r}, "
                         f"got {args.stages}.")
    return stages[:args.stages]


def shares(flag: str, text: str) -> tuple[float, ...]:
    """"0.75,0.25" -> (0.75, 0.25), each checked to lie in [0, 1] (a one-line ValueError naming `flag`)."""
    try:
        shares = tuple(float(part) for part in str(text).split(","))
    except ValueError:
        shares = ()
    if not shares or not all(0.0 <= x <= 1.0 for x in shares):
        raise ValueError(f"{flag} takes shares in [0, 1], one or a comma list (e.g. 0.75,0.25), got {text!r}.")
    return shares


