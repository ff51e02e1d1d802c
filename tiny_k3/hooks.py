"""Hooks: plain changes to one forward pass, for "what if" experiments. The model knows no more than this.

`model(tokens, cache, recorder, hooks=Hooks(...))` runs the same math with these changes in force, each at
one place in the forward pass (the simulator's `sim.interventions` translates its named changes into this):

| field            | where it acts                              | what it changes                                     |
|------------------|--------------------------------------------|-----------------------------------------------------|
| blocked_experts  | `Router.forward`, before top-k (moe.py)    | those experts' biased scores are -inf: never chosen |
| forced_experts   | `Router.forward`, instead of top-k         | exactly these k experts; weights from their s       |
| unbiased         | `Router.forward`, before top-k             | select on topk(s) instead of topk(s + b)            |
| reset_heads      | `KDALayer.forward`, before the first token | S and the conv tail of those heads start at zero    |
| decay_scale      | `KDALayer.forward`, after `kda_gate`       | g -> factor * g (0: no forgetting)                  |
| forget_before    | `KDALayer.forward`, after `kda_gate`       | at marked tokens every KDA state is wiped (g -> -30); |
|                  |                                            | marking every token: `kda_stateless`, the same limit |
| uniform_depth    | every depth read of those layers (model.py)| AttnRes query w_l = 0: uniform weights 1/N          |
| attention_window | `GatedMLA.forward`, the causal mask        | a query sees only the last `window` keys            |
| mla_hidden_keys  | `GatedMLA.forward`, the causal mask        | no query reads the marked keys (each still sees     |
|                  |                                            | itself): recall's definitions hidden in training    |

With `hooks=None` (the default) none of this code runs. Indices are 0-based layers; in `uniform_depth`
the index `num_layers` names the final read before the head.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .cache import KDAState
from .moe import Routing, route

FORGET_LOG_DECAY = -30.0   # log alpha at a forgetting token: e^-30 ≈ 1e-13 of the state survives


@dataclass(frozen=True)
class Hooks:
    """Interventions for one forward call; the empty Hooks() changes nothing."""

    blocked_experts: dict[int, tuple[int, ...]] = field(default_factory=dict)  # MoE layer -> never selected
    forced_experts: dict[int, tuple[int, ...]] = field(default_factory=dict)   # MoE layer -> exactly these k
    unbiased: frozenset[int] = frozenset()            # MoE layers that select on the unbiased scores
    reset_heads: dict[int, tuple[int, ...]] = field(default_factory=dict)      # KDA layer -> heads zeroed first
    decay_scale: dict[int, float] = field(default_factory=dict)                # KDA layer -> factor on g
    uniform_depth: frozenset[int] = frozenset()       # layers whose depth reads get uniform weights
    attention_window: int | None = None               # MLA: keys within the last `window` tokens only
    # [B, T] bool: every KDA layer forgets its whole state S just before these tokens write (a training recipe,
    # "state dropout", tiny_k3.data.Stage.forget_share: what was said before them reaches later tokens through the
    # MLA cache, and through the few inputs that each short conv still reads across the mark)
    forget_before: torch.Tensor | None = None
    # [B, T] bool: no MLA query attends to these tokens' keys, though each still sees itself (a training recipe,
    # tiny_k3.data.Stage.hidden_share: the definitions of recall lines hidden from the MLA layers, as the evaluation's
    # cut recall.hide_definitions_from_mla hides them, so that only the KDA states can carry them to the queries)
    mla_hidden_keys: torch.Tensor | None = None

    # ------------------------------------------------------------------ MoE (moe.py, Router.forward)
    def changes_routing(self, layer: int) -> bool:
        return layer in self.blocked_experts or layer in self.forced_experts or layer in self.unbiased

    def route(self, layer: int, scores: torch.Tensor, router) -> Routing:
        """scores [..., E] (unbiased sigmoid affinities) -> Routing under this layer's changes.

        Blocking adds -inf to the blocked experts' selection bias, so top-k takes the next in line; forcing
        replaces the choice, ordering the forced ids by descending biased score as `route` does; either way
        the weights are the chosen experts' unbiased scores, renormalised (k > 1) and scaled as `route`'s are
        (`Router.routing_for`): a single forced expert keeps its score, as the released router does.
        """
        bias = None if layer in self.unbiased else router.bias
        blocked = self.blocked_experts.get(layer, ())
        if blocked:
            bias = torch.zeros_like(router.bias) if bias is None else bias.clone()
            bias[list(blocked)] = float("-inf")
        forced = self.forced_experts.get(layer)
        if forced is None:
            return route(scores, bias, router.top_k, router.renormalize, router.scaling)
        ids = torch.tensor(forced, device=scores.device).expand(*scores.shape[:-1], len(forced))
        biased = scores.gather(-1, ids) + (0 if bias is None else bias[ids])
        ids = ids.gather(-1, torch.argsort(biased, dim=-1, descending=True, stable=True))
        return router.routing_for(scores, ids)

    # ------------------------------------------------------------------ KDA (kda.py, KDALayer.forward)
    def reset_state(self, layer: int, cache: KDAState | None, heads: int, head_dim: int) -> KDAState | None:
        """The state this layer starts from: `cache` with the reset heads' S [K, V] and conv tail zeroed.

        The conv tail [B, W-1, C] holds q | k | v channels, each head-major (head h: channels h*K .. h*K+K-1
        of its part), so a head's reset clears its own channels in all three parts. None stays None (zeros).
        """
        reset = self.reset_heads.get(layer)
        if reset is None or cache is None:
            return cache
        state, conv = cache.state.clone(), cache.conv.clone()
        for h in reset:
            state[:, h] = 0
            for part in range(3):                          # q, k, v (K = V in this model)
                start = part * heads * head_dim + h * head_dim
                conv[..., start:start + head_dim] = 0
        return KDAState(state, conv)

    # ------------------------------------------------------------------ MLA (mla.py, GatedMLA.forward)
    def visible_keys(self, key_mask: torch.Tensor | None, keys: int) -> torch.Tensor | None:
        """key_mask [B, S] (False: padding) with `mla_hidden_keys` turned False too; S = `keys`, every key a
        query may read. Hiding applies to a forward over the whole sequence: the mask must cover every key."""
        if self.mla_hidden_keys is None:
            return key_mask
        if self.mla_hidden_keys.shape[-1] != keys:
            raise ValueError(f"Hooks.mla_hidden_keys must mark all {keys} keys the MLA reads ([B, {keys}]), "
                             f"got shape {list(self.mla_hidden_keys.shape)}.")
        visible = ~self.mla_hidden_keys
        return visible if key_mask is None else key_mask.bool() & visible

    def forgets_every_token(self) -> bool:
        """True when `forget_before` marks every token: each KDA layer keeps no state (kda.kda_stateless)."""
        return self.forget_before is not None and bool(self.forget_before.all())

    def scale_decay(self, layer: int, g: torch.Tensor) -> torch.Tensor:
        """g [B, T, H, K] log-decay -> factor * g: alpha = exp(g) becomes alpha ** factor; then, at the tokens
        `forget_before` marks, g = FORGET_LOG_DECAY on every channel: alpha = e^-30, the state S_{t-1} is gone
        before token t writes (S_t = beta_t k_t v_t^T, kda.md §2). Finite, not -inf: the chunked form subtracts
        cumulative decays, and inf - inf would be NaN."""
        factor = self.decay_scale.get(layer)
        g = g if factor is None else g * factor
        if self.forget_before is None:
            return g
        if tuple(self.forget_before.shape) != tuple(g.shape[:2]):
            raise ValueError(f"Hooks.forget_before must have shape [B, T] = {list(g.shape[:2])}, "
                             f"got {list(self.forget_before.shape)}.")
        return g.masked_fill(self.forget_before[:, :, None, None], FORGET_LOG_DECAY)
