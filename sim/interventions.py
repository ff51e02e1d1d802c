"""Interventions: named changes to the forward pass, for `Simulation.what_if(*changes, steps=1)`.

Each change is a frozen dataclass that says what it changes and where; `to_hooks` turns a list of them
into the plain `tiny_k3.hooks.Hooks` the model understands, after `check` has read each one against the
config (one sentence per mistake: which layers, experts or heads exist). Layers are 0-based.

    sim.what_if(AblateExpert(layer=3, expert=17))         # expert 17 can never be chosen at layer 3
    sim.what_if(ResetState(layer=2), steps=8)             # wipe one KDA layer's memory, then generate
    sim.what_if(TruncateContext(window=4), NoSelectionBias())
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from tiny_k3.config import K3Config
from tiny_k3.hooks import Hooks


class InterventionError(ValueError):
    """A change that does not fit the model; the message is one sentence naming what is allowed."""


def layer_span(layers: list[int]) -> str:
    """Layer indices for a message: all of them up to 8, else "first to last"."""
    return ", ".join(map(str, layers)) if len(layers) <= 8 else f"{layers[0]} to {layers[-1]}"


def _layer(change, layer, allowed: list[int], what: str, config: K3Config, none_ok: bool = True) -> None:
    name = type(change).__name__
    if not allowed:
        raise InterventionError(f"{name} acts on {what} layers and preset {config.name!r} has none.")
    if layer is None and none_ok:
        return
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
        raise InterventionError(f"{name}: layer must be a layer number{' or None (all)' if none_ok else ''}, "
                                f"got {layer!r}.")
    if layer not in allowed:
        raise InterventionError(f"{name}: layer {layer} is not {'an' if what[0] in 'AEIMO' else 'a'} {what} layer; "
                                f"{what} layers are {layer_span(allowed)}.")


def _expert(change, expert, config: K3Config, layer: int) -> None:
    if isinstance(expert, bool) or not isinstance(expert, numbers.Integral) or not 0 <= expert < config.num_experts:
        raise InterventionError(f"{type(change).__name__}: expert {expert!r} is out of range; layer {layer} has "
                                f"experts 0 to {config.num_experts - 1}.")


@dataclass(frozen=True)
class AblateExpert:
    """Expert `expert` can never be selected at MoE layer `layer`.

    Where: the router, before top-k (tiny_k3.moe.Router.forward). Its biased score s + b is set to -inf,
    so top-k takes the next expert in line; the weights are the winners' unbiased scores, renormalised.
    """

    layer: int
    expert: int

    def label(self) -> str:
        return f"ablate expert {self.expert} at L{self.layer}"

    def check(self, config: K3Config) -> None:
        _layer(self, self.layer, config.moe_layers, "MoE", config, none_ok=False)
        _expert(self, self.expert, config, self.layer)


@dataclass(frozen=True)
class ForceExperts:
    """Exactly `experts` (k distinct ids, k = top_k) are selected at MoE layer `layer`.

    Where: the router, instead of top-k. Weights are their unbiased scores s, renormalised and scaled as
    usual (k3_facts.md §3b); the ids are ordered by descending biased score, as the router orders them.
    """

    layer: int
    experts: tuple[int, ...]

    def __post_init__(self):
        try:
            object.__setattr__(self, "experts", tuple(self.experts))
        except TypeError:
            raise InterventionError(f"ForceExperts: experts must be a list of expert ids, got {self.experts!r}.") from None

    def label(self) -> str:
        return f"force experts {list(self.experts)[:4]}{'…' if len(self.experts) > 4 else ''} at L{self.layer}"

    def check(self, config: K3Config) -> None:
        _layer(self, self.layer, config.moe_layers, "MoE", config, none_ok=False)
        if len(self.experts) != config.top_k:
            raise InterventionError(f"ForceExperts needs exactly top_k = {config.top_k} expert ids for layer "
                                    f"{self.layer}, got {len(self.experts)}.")
        for e in self.experts:
            _expert(self, e, config, self.layer)
        repeated = sorted({e for e in self.experts if self.experts.count(e) > 1})
        if repeated:
            raise InterventionError(f"ForceExperts lists expert {repeated[0]} more than once; the {config.top_k} "
                                    f"experts must all be different.")


@dataclass(frozen=True)
class NoSelectionBias:
    """Select with the unbiased scores at one MoE layer, or all (layer=None): topk(s) instead of topk(s + b).

    Where: the router, before top-k. The weights never used the bias, so only *which* experts win changes;
    the Frame's routing record still shows the learned bias b (the thing switched off).
    """

    layer: int | None = None

    def label(self) -> str:
        return f"no selection bias ({_where(self.layer)})"

    def check(self, config: K3Config) -> None:
        _layer(self, self.layer, config.moe_layers, "MoE", config)


@dataclass(frozen=True)
class ResetState:
    """Zero the KDA recurrent state S and the short-conv tail of one head (of one or every KDA layer), one
    layer, or all KDA layers (layer=None, head=None), once, just before the cursor's input token.

    Where: tiny_k3.kda.KDALayer.forward, on the state it starts from (kda.md §1: S_{t-1} = 0). Later tokens
    of the what-if write into the wiped state as usual; MLA caches are untouched.
    """

    layer: int | None = None
    head: int | None = None

    def label(self) -> str:
        return f"reset state ({_where(self.layer)}{'' if self.head is None else f', head {self.head}'})"

    def check(self, config: K3Config) -> None:
        _layer(self, self.layer, config.kda_layers, "KDA", config)
        if self.head is not None and (isinstance(self.head, bool) or not isinstance(self.head, numbers.Integral)
                                      or not 0 <= self.head < config.kda_heads):
            raise InterventionError(f"ResetState: head {self.head!r} is out of range; KDA heads are 0 to "
                                    f"{config.kda_heads - 1}.")


@dataclass(frozen=True)
class ScaleDecay:
    """Multiply the KDA log-decay g by `factor` at one KDA layer or all (layer=None), for every token of
    the what-if: alpha = exp(g) becomes alpha ** factor. factor 0 = no forgetting, 1 = as trained,
    larger = faster forgetting.

    Where: tiny_k3.kda.KDALayer.forward, right after kda_gate (kda.md §1, the Diag(exp g_t) decay).
    """

    layer: int | None = None
    factor: float | None = None

    def label(self) -> str:
        return f"decay x{self.factor:g} ({_where(self.layer)})"

    def check(self, config: K3Config) -> None:
        if isinstance(self.layer, float):
            raise InterventionError(f"ScaleDecay: layer must be a layer number or None, got {self.layer!r}; "
                                    f"to scale every KDA layer write ScaleDecay(factor={self.layer!r}).")
        _layer(self, self.layer, config.kda_layers, "KDA", config)
        f = self.factor
        if isinstance(f, bool) or not isinstance(f, numbers.Real) or not math.isfinite(f) or f < 0:
            raise InterventionError(f"ScaleDecay: factor must be a finite number 0 or more (0: no forgetting, "
                                    f"1: as trained), got {f!r}.")


@dataclass(frozen=True)
class UniformDepth:
    """Force the Attention Residuals weights uniform (1/N over the N sources) at one layer's two reads, or
    at every read (layer=None); layer = num_layers names the final read before the head.

    Where: tiny_k3.attnres.DepthStream.read, as if the pseudo-query w_l were zero (attnres.md §3): the
    standard-residual picture, the model as it was before training taught it where to look.
    """

    layer: int | None = None

    def label(self) -> str:
        return f"uniform depth weights ({_where(self.layer)})"

    def check(self, config: K3Config) -> None:
        if config.residual == "standard":
            raise InterventionError(f"UniformDepth needs Attention Residuals and preset {config.name!r} uses the "
                                    f"standard residual.")
        _layer(self, self.layer, list(range(config.num_layers + 1)), "depth-read", config)


@dataclass(frozen=True)
class TruncateContext:
    """MLA layers attend only to the last `window` tokens (the current one included): a sliding window.

    Where: tiny_k3.mla.GatedMLA.forward, the causal mask. The cache still stores every token (the bytes do
    not change), and KDA layers still carry their state: what the window hides, only KDA can remember.
    In `what_if` it applies to the all-MLA twin too (WhatIf.twin_kl). Where a short conv stands in front of the
    attention (the twin's, K3Config.mla_conv_layers) each row also mixes the W-1 inputs before it, so a window
    of w still reads w + W-1 inputs (sim.recall_moment.mla_blind_window hides a value accordingly).
    """

    window: int

    def label(self) -> str:
        return f"MLA window {self.window}"

    def check(self, config: K3Config) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, numbers.Integral) or self.window < 1:
            raise InterventionError(f"TruncateContext: window must be a whole number of tokens, 1 or more, "
                                    f"got {self.window!r}.")
        _layer(self, None, config.mla_layers, "MLA", config)


CHANGES = (AblateExpert, ForceExperts, NoSelectionBias, ResetState, ScaleDecay, UniformDepth, TruncateContext)


def check_changes(changes, config: K3Config) -> tuple:
    """Validate each change against `config` and against each other; returns them as a tuple."""
    return checked_hooks(changes, config)[0]


def checked_hooks(changes, config: K3Config) -> tuple[tuple, Hooks]:
    """(the changes as a tuple, their Hooks): validated against `config` and each other, turned into hooks once."""
    changes = tuple(changes)
    names = ", ".join(c.__name__ for c in CHANGES)
    for c in changes:
        if not isinstance(c, CHANGES):
            raise InterventionError(f"what_if takes changes from sim.interventions ({names}), got {c!r}.")
        c.check(config)
    forced = [c.layer for c in changes if isinstance(c, ForceExperts)]
    if len(forced) != len(set(forced)):
        raise InterventionError(f"two ForceExperts for layer {next(x for x in forced if forced.count(x) > 1)}; "
                                f"give one list of experts per layer.")
    hooks = to_hooks(changes, config)
    for layer, blocked in hooks.blocked_experts.items():
        clash = set(blocked) & set(hooks.forced_experts.get(layer, ()))
        if clash:
            raise InterventionError(f"expert {min(clash)} is both ablated and forced at layer {layer}; "
                                    f"drop one of the two changes.")
        if config.num_experts - len(blocked) < config.top_k:
            raise InterventionError(f"layer {layer} would have {config.num_experts - len(blocked)} experts left, "
                                    f"fewer than top_k = {config.top_k}; ablate fewer.")
    return changes, hooks


def to_hooks(changes, config: K3Config, reset: bool = True) -> Hooks:
    """The tiny_k3 hooks for these (checked) changes; reset=False leaves out the one-time ResetState."""
    blocked: dict[int, tuple[int, ...]] = {}
    forced: dict[int, tuple[int, ...]] = {}
    unbiased: set[int] = set()
    heads: dict[int, set[int]] = {}
    scale: dict[int, float] = {}
    uniform: set[int] = set()
    window = None
    for c in changes:
        if isinstance(c, AblateExpert):
            blocked[c.layer] = tuple(sorted(set(blocked.get(c.layer, ())) | {int(c.expert)}))
        elif isinstance(c, ForceExperts):
            forced[c.layer] = tuple(int(e) for e in c.experts)
        elif isinstance(c, NoSelectionBias):
            unbiased |= set(config.moe_layers if c.layer is None else [c.layer])
        elif isinstance(c, ResetState) and reset:
            for layer in config.kda_layers if c.layer is None else [c.layer]:
                heads.setdefault(layer, set()).update(range(config.kda_heads) if c.head is None else [c.head])
        elif isinstance(c, ScaleDecay):
            for layer in config.kda_layers if c.layer is None else [c.layer]:
                scale[layer] = scale.get(layer, 1.0) * float(c.factor)   # two scalings compose
        elif isinstance(c, UniformDepth):
            uniform |= set(range(config.num_layers + 1) if c.layer is None else [c.layer])
        elif isinstance(c, TruncateContext):
            window = int(c.window) if window is None else min(window, int(c.window))  # both windows in force
    return Hooks(blocked_experts=blocked, forced_experts=forced, unbiased=frozenset(unbiased),
                 reset_heads={k: tuple(sorted(v)) for k, v in heads.items()}, decay_scale=scale,
                 uniform_depth=frozenset(uniform), attention_window=window)


def describe(change) -> str:
    """A short label for a change, for menus and figure titles: "ablate expert 17 at L3"."""
    return change.label()


def _where(layer) -> str:
    return "all layers" if layer is None else f"L{layer}"
