"""What-if: recompute the cursor's frame with changes in force, beside the original, off the timeline.

`Simulation.what_if(*changes, at=frame, steps=1)` calls `what_if(sim, plan, at, steps)` here, the changes checked
and turned into hooks once (WhatIfPlan). From the decode state before frame `at` (Simulation.caches_at: a KDA
snapshot, a cut KV cache), two runs go forward
`steps` tokens: the original (no hooks) and the branch (the changes as tiny_k3 hooks; a ResetState only
on the first token). Each step follows the timeline's choice rule: a forced token (the prompt) stays
forced, a sampled one is drawn again, with the same temperature and seed, from that run's own logits.
The main timeline, its caches and its snapshots are never written.

Per step: KL(original || branch) of the next-token distributions, both top-5s, and the first sublayer
(execution order: embed, L0 attn, L0 mlp, ..., head) whose output differs by more than 1e-6 relative.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from tiny_k3.probe import EmbedEvent, Event, LogitsEvent, Recorder, SublayerEvent
from tiny_k3.tokenizer import EOS, decode, token_text

from tiny_k3.hooks import Hooks

from .frame import Choice, Frame
from .interventions import TruncateContext, checked_hooks
from .memory import non_negative_int

DIVERGENCE_RTOL = 1e-6


@dataclass(frozen=True)
class WhatIfPlan:
    """Changes checked against a config and turned into hooks, once: `first` for the what-if's first token, `later`
    for the tokens after it (a ResetState wipes a state once, before the first token). None: no change."""

    changes: tuple
    first: Hooks | None
    later: Hooks | None

    @classmethod
    def of(cls, changes, config) -> "WhatIfPlan":
        """From sim.interventions changes (a WhatIfPlan is returned as it is); one clear error for a bad one."""
        if isinstance(changes, WhatIfPlan):
            return changes
        changes, hooks = checked_hooks(changes, config)
        if not changes:
            return cls((), None, None)
        return cls(changes, hooks, dataclasses.replace(hooks, reset_heads={}))


@dataclass(frozen=True)
class WhatIf:
    """The answer to "what would the model have done here if ...", one entry per step.

    frames / original: the branch's and the original's Frames (frames[0] is the cursor's frame recomputed).
    kl[s]: KL(p_original || p_branch) in nats over the next-token distributions of step s.
    top_before[s] / top_after[s]: top-5 next tokens as (id, text, probability).
    first_divergence[s]: label of the first sublayer whose output moved by > 1e-6 relative ("L2 attn · KDA"),
    None when nothing did. text_before / text_after: the tokens each run chose, as text.
    twin_kl[s]: for a TruncateContext with the twin present, KL(twin || windowed twin) on the original tokens.
    """

    changes: tuple
    position: int
    frames: tuple[Frame, ...]
    original: tuple[Frame, ...]
    kl: tuple[float, ...]
    top_before: tuple[tuple[tuple[int, str, float], ...], ...]
    top_after: tuple[tuple[tuple[int, str, float], ...], ...]
    first_divergence: tuple[str | None, ...]
    text_before: str
    text_after: str
    twin_kl: tuple[float, ...] = ()
    logits_before: tuple[np.ndarray, ...] = field(default=(), repr=False)
    logits_after: tuple[np.ndarray, ...] = field(default=(), repr=False)

    @property
    def steps(self) -> int:
        return len(self.frames)


class _Outputs(Recorder):
    """Keeps every sublayer's output (and the embedding and logits) of one step, labelled in execution order."""

    def __init__(self):
        self.outputs: list[tuple[str, torch.Tensor]] = []

    def on(self, event: Event) -> None:
        if isinstance(event, EmbedEvent):
            self.outputs.append(("embed", event.x))
        elif isinstance(event, SublayerEvent):
            kind = {"moe": "MoE", "dense": "dense"}.get(event.kind, event.kind.upper())
            self.outputs.append((f"L{event.layer} {event.site} · {kind}", event.out))
        elif isinstance(event, LogitsEvent):
            self.outputs.append(("head", event.logits))


def first_divergence(a: _Outputs, b: _Outputs, rtol: float = DIVERGENCE_RTOL) -> str | None:
    """The first label whose outputs differ: ||a - b|| > rtol * max(||a||, ||b||)."""
    for (label, x), (_, y) in zip(a.outputs, b.outputs):
        x, y = x.double(), y.double()
        scale = max(float(x.norm()), float(y.norm()))
        if float((x - y).norm()) > rtol * scale:
            return label
    return None


def kl_divergence(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(softmax p || softmax q) in nats, float64."""
    def log_softmax(z):
        z = z.astype(np.float64)
        z = z - z.max()
        return z - np.log(np.exp(z).sum())
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float(max(0.0, (np.exp(lp) * (lp - lq)).sum()))


def _top(frame: Frame, label=token_text) -> tuple[tuple[int, str, float], ...]:
    """The frame's top-5 as (id, label, probability); label: the run's tokenizer's (bytes by default)."""
    return tuple((int(t), label(int(t)), float(p)) for t, p in zip(frame.top_ids, frame.top_probs))


def _choice(sim, index: int) -> Choice:
    """How frame `index` of the timeline chose its token; past the timeline, as step() would sample."""
    if index < len(sim.frames):
        return sim.frames[index].choice
    return Choice.sampled(sim.temperature, sim.sample_seed)


@torch.no_grad()
def _twin_kl(sim, window_hooks, start: int, tokens: list[int]) -> tuple[float, ...]:
    """The all-MLA twin over the original tokens from `start`, with and without the window: KL per step."""
    _, twin = sim.caches_at(start)
    windowed = twin.clone()
    out = []
    for token in tokens:
        x = torch.tensor([[token]], device=sim.device)
        a, twin = sim.twin_model(x, twin)
        b, windowed = sim.twin_model(x, windowed, hooks=window_hooks)
        out.append(kl_divergence(a[0, -1, :EOS + 1].float().cpu().numpy(), b[0, -1, :EOS + 1].float().cpu().numpy()))
    return tuple(out)


@torch.no_grad()
def what_if(sim, plan: WhatIfPlan, at: int, steps: int = 1, progress=None) -> WhatIf:
    """See the module docstring; `sim` is a sim.Simulation, left exactly as it was (cursor included).

    progress(done, steps), if given, is called after each step; whatever it raises abandons the what-if
    (a front end's cancel: the TUI stops between two tokens), and nothing has been written anywhere."""
    steps = non_negative_int(steps, "steps")
    if steps < 1:
        raise ValueError(f"steps must be 1 or more (the frame's own recomputation is step 1), got {steps}.")
    start = at
    last = sim.config.max_seq_len - 1
    if start + steps - 1 > last:
        raise ValueError(f"steps={steps} would pass the last position ({last}) that preset {sim.config.name!r} "
                         f"allows; at most {last - start + 1} steps fit from frame {start}.")
    changes, first_hooks, later_hooks = plan.changes, plan.first, plan.later

    cache, _ = sim.caches_at(start)
    branch_cache = cache.clone()
    token_o = token_b = sim.frames[start].input_id
    original, branch, logits_o, logits_b, kl, diverged = [], [], [], [], [], []
    for s in range(steps):
        position = start + s
        choice = _choice(sim, position)
        prompt = position < sim.prompt_len
        seen_o, seen_b = _Outputs(), _Outputs()
        fo, lo, cache, _ = sim.compute_frame(position, token_o, choice, prompt, cache, None, watch=seen_o)
        fb, lb, branch_cache, _ = sim.compute_frame(position, token_b, choice, prompt, branch_cache, None,
                                                    hooks=first_hooks if s == 0 else later_hooks, watch=seen_b)
        original.append(fo), branch.append(fb), logits_o.append(lo), logits_b.append(lb)
        kl.append(kl_divergence(lo, lb))
        diverged.append(first_divergence(seen_o, seen_b))
        token_o, token_b = fo.token_id, fb.token_id
        if progress is not None:
            progress(s + 1, steps)

    twin_kl: tuple[float, ...] = ()
    window = first_hooks.attention_window if first_hooks is not None else None
    if window is not None and sim.twin_model is not None and any(isinstance(c, TruncateContext) for c in changes):
        twin_kl = _twin_kl(sim, Hooks(attention_window=window), start, [f.input_id for f in original])
    tokenizer = getattr(sim, "tokenizer", None)          # a real checkpoint's BPE labels its own run (sim.real)
    label, text = (token_text, decode) if tokenizer is None else (tokenizer.token_text, tokenizer.decode)
    return WhatIf(
        changes=changes, position=start, frames=tuple(branch), original=tuple(original), kl=tuple(kl),
        top_before=tuple(_top(f, label) for f in original), top_after=tuple(_top(f, label) for f in branch),
        first_divergence=tuple(diverged), text_before=text([f.token_id for f in original]),
        text_after=text([f.token_id for f in branch]), twin_kl=twin_kl,
        logits_before=tuple(logits_o), logits_after=tuple(logits_b))


def branch_timeline(sim, w: WhatIf):
    """A read-only Simulation whose frames are the branch as it was seen: the timeline's frames before the
    what-if, then `w.frames` (Simulation.view: every view over frames draws the branch as it draws the
    timeline); its cursor is on the branch's last frame. Never step it: it has no decode state of its own."""
    return sim.view(list(sim.frames[:w.position]) + list(w.frames))
