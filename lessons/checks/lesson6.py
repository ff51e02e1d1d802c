"""Lesson 6 checks: the sublayers one token passes, the number of depth sources."""

from __future__ import annotations

import functools
import math

import torch

from ._common import ExerciseError, _call, _close, _fmt, _int, _passed, _tensor, register

def _traced_configs():
    """Small configs whose real forward pass is cheap, with different schedules and residual modes."""
    from tiny_k3 import K3Config

    tiny = K3Config.preset("tiny")
    return [
        tiny,
        tiny.replace(name="tiny-6L", num_layers=6, layer_kinds=(), first_k_dense=2, attnres_block_size=3),
        tiny.replace(name="tiny-9L-full", num_layers=9, layer_kinds=(), first_k_dense=1, residual="full"),
        tiny.replace(name="tiny-5L-b4", num_layers=5, layer_kinds=(), first_k_dense=0, attnres_block_size=4),
    ]


@functools.lru_cache(maxsize=8)
def _trace_config(cfg):
    """(sublayer kinds in order, [(layer, site, number of depth sources)]) from a real forward pass."""
    from tiny_k3 import TinyK3, TraceRecorder

    torch.manual_seed(0)
    model = TinyK3(cfg)
    rec = TraceRecorder()
    with torch.no_grad():
        model(torch.tensor([[256, 104, 105]]), recorder=rec)
    kinds = tuple(data["kind"] for _, data in rec.of("sublayer"))
    depth = tuple((layer, data["site"], data["weights"].shape[-1]) for layer, data in rec.of("depth")
                  if data["weights"] is not None)
    return kinds, depth


@register("6.1", "sublayer_order", difficulty=1, minutes=6, expects="""
my_sublayer_order(config) -> list of str
  the sublayers one token passes through, in order, for a tiny_k3.K3Config:
  "embed", then for each layer its attention sublayer ("kda" or "mla") and its MLP sublayer
  ("dense" or "moe"), then "head".
Checked against the events a real TinyK3 forward pass reports (tiny_k3.TraceRecorder).
""",
          hints=("config.layer_kinds gives each layer's attention kind (K3: MLA every 4th layer and the last); the "
                 'first config.first_k_dense layers have a dense MLP, the rest MoE.',
                 "A flat list of strings: 'embed' first and 'head' last. In between, for each layer i in order, two "
                 "entries: its attention kind (entry i of config.layer_kinds, 'kda' or 'mla'), then its MLP: "
                 "'dense' while i is below config.first_k_dense, 'moe' from there on. For L layers that is 2L + 2 "
                 'entries.',
                 "order = ['embed']\n"
                 '  for i, kind in enumerate(config.layer_kinds):\n'
                 "      order += [kind, 'dense' if i < config.first_k_dense else 'moe']\n"
                 "  return order + ['head']"))
def check_sublayer_order(fn) -> None:
    for cfg in _traced_configs():
        want = ["embed", *_trace_config(cfg)[0], "head"]
        got = _call(fn, (cfg,), f"config {cfg.name!r} ({cfg.num_layers} layers, first_k_dense={cfg.first_k_dense})")
        if not isinstance(got, (list, tuple)) or not all(isinstance(x, str) for x in got):
            raise ExerciseError("Return a list of strings such as ['embed', 'kda', 'dense', ..., 'head'].")
        got = list(got)
        if got == want:
            continue
        right = f"For {cfg.name!r}: {want}\n  yours: {got}"
        if len(got) != len(want):
            missing = [x for x in ("embed", "head") if x not in got]
            if missing:
                raise ExerciseError(f"The walk starts at the embedding and ends at the head; missing {missing}. " + right)
            raise ExerciseError(f"A token passes {len(want)} stops: embed, 2 per layer × {cfg.num_layers} layers, "
                                f"head; you listed {len(got)}. " + right)
        attn_got, attn_want = got[1:-1:2], want[1:-1:2]
        if attn_got != attn_want:
            if attn_got[:-1] == attn_want[:-1]:
                raise ExerciseError("The last layer is always MLA in K3's schedule (K3: layers 92 and 93 are both "
                                    "MLA). " + right)
            raise ExerciseError("The attention kinds follow config.layer_kinds (K3: MLA at 1-based layers 4, 8, … "
                                "and the last). " + right)
        raise ExerciseError(f"The first {cfg.first_k_dense} layer(s) have a dense MLP, the rest MoE "
                            "(config.first_k_dense). " + right)
    _passed("check_sublayer_order", "embed → (attention, MLP) per layer → head, as a real forward pass reports it.")


@register("6.2", "num_sources", difficulty=3, minutes=10, expects="""
my_num_sources(config, layer, site) -> int
  how many sources the depth-attention read before a sublayer attends over (the length of its weights),
  for a tiny_k3.K3Config with residual "block" or "full"; layer is 0-based, site is "attn" or "mlp"
  (or "out" with layer = num_layers: the final read before the head).
Checked against the depth weights a real TinyK3 forward pass reports.
""",
          hints=("Number the sublayers: layer i's attention is sublayer 2i, its MLP 2i + 1, the head's read "
                 '2·num_layers. Before sublayer j, j outputs exist; count the embedding, the completed blocks and a '
                 'started block.',
                 "Give the read an index j: 2·layer for 'attn', 2·layer + 1 for 'mlp' ('out' comes with layer = "
                 'num_layers, so j = 2·num_layers). j is also how many sublayer outputs exist before the read. With '
                 'block size S (S = 1 for Full AttnRes) they fill ⌊j / S⌋ completed blocks, plus one started block '
                 'when S does not divide j. Add 1 for the embedding.',
                 "block = 1 if config.residual == 'full' else config.attnres_block_size\n"
                 "  done = 2 * layer + (1 if site == 'mlp' else 0)\n"
                 '  return 1 + done // block + (1 if done % block else 0)'))
def check_num_sources(fn) -> None:
    for cfg in _traced_configs():
        if cfg.residual == "standard":
            continue
        for layer, site, want in _trace_config(cfg)[1]:
            got = _int(_call(fn, (cfg, layer, site), f"config {cfg.name!r}, layer={layer}, site={site!r}"),
                       "my_num_sources(...)")
            if got == want:
                continue
            S = 1 if cfg.residual == "full" else cfg.attnres_block_size
            j = 2 * layer + (site == "mlp")
            right = (f"Before {site} of layer {layer} in {cfg.name!r} (residual {cfg.residual!r}, S = {S}): "
                     f"{j} output{'s' if j != 1 else ''} exist{'s' if j == 1 else ''} → 1 + {j // S} + {int(j % S > 0)} = {want} "
                     f"sources; yours is {got}.")
            if got == j + 1 and S > 1:
                raise ExerciseError("That is Full AttnRes (one source per output). Block AttnRes sums each block "
                                    "of S outputs into one source. " + right)
            if got == want - 1 and j % S:
                raise ExerciseError("You forgot the partial sum of the current block: from a block's second "
                                    "sublayer on, it is a source too. " + right)
            if got == want + 1 and not j % S:
                raise ExerciseError("At a block boundary the partial sum has just been closed into a block sum; "
                                    "there is no extra partial source. " + right)
            raise ExerciseError(right)
    _passed("check_num_sources", "embedding + completed blocks + partial sum, as the depth weights of a real "
                                 "forward pass (block and full residuals).")
