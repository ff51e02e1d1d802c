"""Latent MoE: a sigmoid router with a selection bias, top-k routed experts in a latent width, shared experts.

K3's MoE sublayer (k3_facts.md §1c, §2, §3b), for x [B, T, D]:

    s = sigmoid(W_r x)                      router affinities in fp32 on the full-width x        [B, T, E]
    ids = topk(s + b, k)                    b = e_score_correction_bias: selection only           [B, T, k]
    w = s[ids] / sum(s[ids]) * scaling      weights from the *unbiased* scores                    [B, T, k]
    z = W_down x                            D -> latent l (K3: 7168 -> 3584)                       [B, T, l]
    y = sum_j w_j E_j(z)                    E_j(z) = W2_j situ_glu(W1_j z, W3_j z), l -> m -> l   [B, T, l]
    out = W_up RMSNorm(y) + Shared(x)       norm after the full sum; shared experts at width D    [B, T, D]

Only the k chosen experts of each token are computed (see `LatentMoE.mix_experts`).

`PlainMoE` is the MoE of DeepSeek-V3, K2 and Kimi Linear (`moe_kind="plain"`): the same router and experts
with no latent: z = x, E_j: D -> m -> D, out = y + Shared(x) (docs/lineage.md §1).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from functools import lru_cache
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from .config import K3Config
from .fused import CachedWeights, autograd_needed, constant, scratch_buffer
from .norm import RMSNorm
from .probe import NO_RECORDER, Recorder


class Routing(NamedTuple):
    """The router's decision for every token.

    expert_ids [..., k] long: the chosen experts, ordered by descending *biased* score s + b.
    weights    [..., k]: their mixing weights, taken from the unbiased scores s.
    scores     [..., E]: all unbiased sigmoid affinities s (what the simulator shows).
    """

    expert_ids: torch.Tensor
    weights: torch.Tensor
    scores: torch.Tensor


def route(scores: torch.Tensor, bias: torch.Tensor | None, top_k: int, renormalize: bool = True,
          scaling: float = 1.0) -> Routing:
    """DeepSeek-V3 / K3 "noaux_tc" selection (k3_facts.md §1c, §3b).

    scores [..., E] sigmoid affinities (fp32); bias [E] or None (zeros). The bias only decides *which*
    experts win (topk of scores + bias); the weights are the unbiased scores of the winners, divided by
    their sum (+1e-20) when `renormalize` and k > 1, then times `scaling`. Ids come out in descending biased score.
    A single expert (k = 1) keeps its score, as released: `if self.top_k > 1 and self.moe_renormalize`
    (PipeNetwork/kimi-k3-mlx@fe0738f reference/modeling_kimi_linear.py line 753); renormalised, its weight would be 1.
    """
    num_experts = scores.shape[-1]
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be between 1 and the number of experts ({num_experts}), got {top_k}.")
    if bias is not None and tuple(bias.shape) != (num_experts,):
        raise ValueError(f"bias must have shape [{num_experts}] (one value per expert), got {list(bias.shape)}.")
    biased = scores if bias is None else scores + bias
    expert_ids = top_k_ids(biased, top_k)
    return Routing(expert_ids, _chosen_weights(scores, expert_ids, renormalize, scaling), scores)


def _chosen_weights(scores: torch.Tensor, expert_ids: torch.Tensor, renormalize: bool, scaling: float) -> torch.Tensor:
    """The chosen experts' unbiased scores [..., k], divided by their sum + 1e-20 (when k > 1: see `route`) and
    times `scaling`.
    (The constants are tensors of the scores' dtype: the same numbers as Python floats, without a cast per op.)"""
    weights = scores.gather(-1, expert_ids)
    if renormalize and expert_ids.shape[-1] > 1:
        weights = weights / weights.sum(-1, keepdim=True).add_(constant(1e-20, weights))
    if scaling != 1.0:
        weights = weights * constant(scaling, weights)
    return weights


# `top_k_ids` takes its two-stage path from this many rows on (below it one topk is cheaper than ten small ops).
TWO_STAGE_MIN_ROWS = 16


def top_k_ids(biased: torch.Tensor, k: int) -> torch.Tensor:
    """`biased.topk(k, dim=-1, sorted=True).indices`, exactly, with about a quarter of the comparisons.

    biased [..., E] -> [..., k] long. torch's CPU topk costs ~8 ns per element of every row (an nth_element
    over (value, index) pairs), which at prefill is a third of the MoE layer. Two stages look at fewer:
    split each row into G groups of s (member i of group g is column i*G + g, so the group maxima are one
    vectorised reduction), keep the k+1 groups with the highest maxima (in any order) and take the top k+1
    of their s(k+1) members, c_1 >= ... >= c_{k+1}. Exactness: the kept maxima are k+1 of the members, so
    c_{k+1} >= the least kept maximum >= every element outside the kept groups. If the c's are strictly
    decreasing, every element but c_1..c_k is <= c_{k+1} < c_k: they are the row's only k largest, in the only
    order topk can give them. A row that fails the test (a tie, NaN: topk's "largest", -inf padding) is
    handed to topk itself, so ties break exactly as before. With E/k = 56 a row is 247 elements, not 896.
    """
    num_experts = biased.shape[-1]
    plan = _two_stage_plan(num_experts, k)
    rows = biased.numel() // max(num_experts, 1)
    if plan is None or rows < TWO_STAGE_MIN_ROWS:
        return biased.topk(k, dim=-1, sorted=True).indices
    size, groups = plan
    with torch.no_grad():
        table = biased.detach().reshape(rows, size, groups)                      # [R, s, G]
        kept = table.amax(1).topk(k + 1, dim=-1, sorted=False).indices           # [R, k+1] group ids
        members = table.gather(2, kept.unsqueeze(1).expand(rows, size, k + 1))  # [R, s, k+1]: member i of kept j
        top = members.view(rows, size * (k + 1)).topk(k + 1, dim=-1)            # position i*(k+1) + j
        # the expert id of every member (i*G + kept j, one broadcast add), read at the top k positions: fewer
        # ops than splitting each position into i and j (integer division and remainder are slow on the CPU)
        member_ids = torch.add(kept.unsqueeze(1), _member_offsets(size, groups, kept.device)).view(rows, -1)
        ids = member_ids.gather(1, top.indices[:, :k])                           # [R, k] expert ids
        values = top.values
        decreasing = values[:, :-1] > values[:, 1:]
        if not bool(decreasing.all()):
            redo = (~decreasing.all(1)).nonzero().squeeze(1)
            ids[redo] = biased.detach().reshape(rows, num_experts)[redo].topk(k, dim=-1, sorted=True).indices
    return ids.view(*biased.shape[:-1], k)


@lru_cache(maxsize=None)
def _member_offsets(size: int, groups: int, device: torch.device) -> torch.Tensor:
    """[s, 1] long: i * G, the offset of member i of a group in `top_k_ids`' table (made once per shape)."""
    with torch.inference_mode(False):   # a normal tensor, usable in and out of inference mode
        return torch.arange(0, size * groups, groups, device=device).unsqueeze(1)


@lru_cache(maxsize=None)
def _two_stage_plan(num_experts: int, k: int) -> tuple[int, int] | None:
    """(s, G) with s * G = E and G >= k + 1 that minimises the G + s(k+1) elements `top_k_ids` looks at per
    row, or None where that saves less than half of E (small E, k = 1: topk's own max scan)."""
    if k < 2:
        return None
    plans = [(groups + size * (k + 1), -size, size, num_experts // size) for size in range(2, num_experts)
             if num_experts % size == 0 and (groups := num_experts // size) >= k + 1]
    if not plans or min(plans)[0] * 2 > num_experts:
        return None
    _, _, size, groups = min(plans)
    return size, groups


def situ_glu(gate: torch.Tensor, up: torch.Tensor, beta_gate: float = 4.0, beta_up: float = 25.0) -> torch.Tensor:
    """K3's SiTU-GLU (k3_facts.md §1c): h = [4 tanh(g/4) sigmoid(g)] * [25 tanh(u/25)], |h| < 100.

    A soft-capped SwiGLU: beta*tanh(x/beta) ~ x for |x| << beta, so for small inputs h ~ silu(g) * u,
    while for large ones the gate stays below beta_gate and the up branch below beta_up in magnitude.
    """
    g, u, scale = constant(beta_gate, gate), constant(beta_up, up), constant(beta_gate * beta_up, gate)
    return torch.tanh(gate / g) * torch.sigmoid(gate) * torch.tanh(up / u) * scale


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU (Shazeer 2020, arXiv:2002.05202), the GLU of DeepSeek-V3, K2 and Kimi Linear: h = silu(g) * u.

    silu(g) = g * sigmoid(g): unbounded, which is what SiTU-GLU's two soft caps change (docs/lineage.md §1; k3_facts.md §1c).
    """
    return F.silu(gate) * up


def glu(gate: torch.Tensor, up: torch.Tensor, config: K3Config) -> torch.Tensor:
    """The gated activation `config.mlp_act` names: "situ" (K3's SiTU-GLU) or "swiglu" (K2, Kimi Linear)."""
    if config.mlp_act == "swiglu":
        return swiglu(gate, up)
    return situ_glu(gate, up, config.situ_beta_gate, config.situ_beta_up)


class GatedMLP(nn.Module):
    """w2(glu(w1 x, w3 x)): the dense first-layer MLP and the (fused) shared experts. x [..., d_in].

    glu is `config.mlp_act`: SiTU-GLU for K3, SwiGLU for K2 and Kimi Linear.
    """

    def __init__(self, d_in: int, d_hidden: int, config: K3Config, device=None, dtype=None):
        super().__init__()
        self.config = config
        self.w1 = nn.Linear(d_in, d_hidden, bias=False, device=device, dtype=dtype)  # gate
        self.w3 = nn.Linear(d_in, d_hidden, bias=False, device=device, dtype=dtype)  # up
        self.w2 = nn.Linear(d_hidden, d_in, bias=False, device=device, dtype=dtype)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(glu(self.w1(x), self.w3(x), self.config))


class Router(nn.Module):
    """Sigmoid router with K3's selection bias.

    `weight` [E, D] is a plain Parameter (the HF checkpoint's `gate.weight`); `bias` [E] float32 is a
    *buffer* (HF `e_score_correction_bias`): saved in the state_dict but never touched by the optimiser,
    only by `update_bias`.
    """

    def __init__(self, dim: int, num_experts: int, top_k: int, *, renormalize: bool = True, scaling: float = 1.0,
                 bias_update_rate: float = 1e-3, init_std: float = 0.02, device=None, dtype=None):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be between 1 and the number of experts ({num_experts}), got {top_k}.")
        self.top_k, self.renormalize, self.scaling = top_k, renormalize, scaling
        self.bias_update_rate = bias_update_rate
        self.weight = nn.Parameter(torch.empty(num_experts, dim, device=device, dtype=dtype))
        self.register_buffer("bias", torch.zeros(num_experts, device=device, dtype=torch.float32))
        nn.init.normal_(self.weight, std=init_std)

    def forward(self, x: torch.Tensor, hooks=None, layer: int = 0) -> Routing:
        """x [..., D] -> Routing. Scores in fp32 (or wider, for a float64 x) on the full-width state (§1c).

        `hooks` (tiny_k3.hooks.Hooks) may block, force or unbias this layer's selection; None: as trained."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        return self.choose(torch.sigmoid(F.linear(x.to(dtype), self.weight.to(dtype))), hooks, layer)

    def choose(self, scores: torch.Tensor, hooks=None, layer: int = 0) -> Routing:
        """The selection from the affinities scores [..., E] (what `forward` does after the sigmoid)."""
        if hooks is not None and hooks.changes_routing(layer):
            return hooks.route(layer, scores, self)
        return route(scores, self.bias, self.top_k, self.renormalize, self.scaling)

    @torch.no_grad()
    def update_bias(self, load: torch.Tensor, rate: float | None = None) -> torch.Tensor:
        """Aux-loss-free balancing (DeepSeek-V3 §2.1.2, k3_facts.md §3b): b += rate * sign(mean(load) - load).

        load [E]: tokens routed to each expert in the last batch. Overloaded experts become less likely to be
        chosen, underloaded ones more; a perfectly balanced load leaves b unchanged. Returns a copy of the new b.
        """
        if tuple(load.shape) != tuple(self.bias.shape):
            raise ValueError(f"load must have shape {list(self.bias.shape)} (tokens per expert), "
                             f"got {list(load.shape)}.")
        rate = self.bias_update_rate if rate is None else rate
        load = load.to(self.bias.device, torch.float32)
        self.bias += rate * torch.sign(load.mean() - load)
        return self.bias.clone()


class LatentMoE(nn.Module):
    """K3's "Stable LatentMoE" sublayer: route on x [B, T, D], run the chosen experts in the latent width.

    Routed experts are stacked: w1, w3 [E, m, l] (gate, up) and w2 [E, l, m] (down), m = moe_intermediate,
    l = latent_dim. After a forward, `last_load` [E] holds the tokens sent to each expert (counted on demand),
    for `self.router.update_bias(self.last_load)` in the training loop. `dense_reference` runs every expert:
    the test oracle for the sparse forward.
    """

    # Decode path while the per-pair weight copies stay below this many elements (measured crossover on CPU,
    # about 1 MB of fp32); above it, sort the pairs by expert. Tests set it to 0 or a huge value to pick a path.
    gather_max_elements = 1 << 18
    # Sorted path: pad every expert to the busiest one's count while that costs at most this many buffer rows
    # per pair (an even load, as in prefill with a balanced router); a more skewed load is cut into tiles.
    pad_max_ratio = 4
    # Without autograd, more than one token: `_forward_tokens` (one product with x, one to the output). Tests set
    # it False to run the general path (`route_tokens`, `mix_experts`, `combine`), the reference.
    fuse_tokens = True
    # `_decode_token`: from this many elements of an expert's W2 (l * m) on, its down products are one
    # matrix-vector product over the k chosen experts side by side (a copy of them), below it k small
    # products (one bmm); measured on one CPU core (small: 128, bmm; mini-896/16: 1024, one product).
    decode_mv_min_elements = 512
    # `_mix_token_major`: None lets `_samples_pay` choose between the sampled products and the padded columns;
    # tests set True or False to run one of them.
    sampled_products: bool | None = None

    def __init__(self, config: K3Config, device=None, dtype=None):
        super().__init__()
        c = config
        self.config = c
        E, D, m, l = c.num_experts, c.hidden_size, c.moe_intermediate, c.latent_dim
        self.router = Router(D, E, c.top_k, renormalize=c.renormalize, scaling=c.routed_scaling,
                             bias_update_rate=c.bias_update_rate, init_std=c.init_std, device=device, dtype=dtype)
        self.down = nn.Linear(D, l, bias=False, device=device, dtype=dtype)
        self.w1 = nn.Parameter(torch.empty(E, m, l, device=device, dtype=dtype))  # gate
        self.w3 = nn.Parameter(torch.empty(E, m, l, device=device, dtype=dtype))  # up
        self.w2 = nn.Parameter(torch.empty(E, l, m, device=device, dtype=dtype))  # down
        self.latent_norm = RMSNorm(l, eps=c.rms_norm_eps, device=device, dtype=dtype)
        self.up = nn.Linear(l, D, bias=False, device=device, dtype=dtype)
        self.shared = (GatedMLP(D, c.num_shared_experts * c.shared_intermediate, c, device=device, dtype=dtype)
                       if c.num_shared_experts else None)
        for weight in (self.w1, self.w3, self.w2):  # nn.Linear weights are TinyK3's `_init_weights`
            nn.init.normal_(weight, std=c.init_std)
        self._last_ids: torch.Tensor | None = None
        # The fused paths' two matrices (`_fused_weights`): a cache (tiny_k3/fused.py), so the state_dict is unchanged.
        self._fused = CachedWeights(self, ("router", "down", "shared.w1", "shared.w3", "up", "latent_norm",
                                           "shared.w2"), _fused_pair)
        # W2 as [E*m, l] for `_mix_sampled`'s sparse-dense down product: a cache too (see `_w2_rows`)
        self._w2_rows_cache = CachedWeights(self, ("w2",), _rows_of_w2, attr=None)
        self._situ_caps = None

    @property
    def last_load(self) -> torch.Tensor:
        """[E] float: tokens routed to each expert in the last forward (zeros before the first)."""
        if self._last_ids is None:
            return torch.zeros(self.config.num_experts, device=self.w1.device)
        return torch.bincount(self._last_ids.reshape(-1), minlength=self.config.num_experts).float()

    def forward(self, x: torch.Tensor, recorder: Recorder = NO_RECORDER, layer: int = 0, hooks=None) -> torch.Tensor:
        """x [B, T, D] -> [B, T, D]. `hooks`: routing changes for a what-if (tiny_k3.hooks), None: none."""
        fused = self._fused_weights(x)
        if fused is not None:
            if x.shape[0] * x.shape[1] == 1 and self._gathers(1):
                return self._decode_token(x, fused, recorder, layer, hooks)
            if self.fuse_tokens:
                return self._forward_tokens(x, fused, recorder, layer, hooks)
        routing = self.route_tokens(x, recorder, layer, hooks)
        z = self.down(x).reshape(-1, self.config.latent_dim)        # [N, l]
        y = self.mix_experts(z, routing.expert_ids.reshape(-1), routing.weights.reshape(-1).to(z.dtype))
        return self.combine(y.reshape(*x.shape[:-1], -1), x)

    def route_tokens(self, x: torch.Tensor, recorder: Recorder = NO_RECORDER, layer: int = 0,
                     hooks=None) -> Routing:
        """Route x [B, T, D] and report it (the "moe" event); the ids are kept for `last_load`."""
        if x.shape[-1] != self.config.hidden_size:
            raise ValueError(f"LatentMoE expects inputs of width hidden_size={self.config.hidden_size}, "
                             f"got shape {list(x.shape)}.")
        return self._report(self.router(x, hooks, layer), recorder, layer)

    def _report(self, routing: Routing, recorder: Recorder, layer: int) -> Routing:
        """Keep the ids for `last_load` (counted lazily) and send the "moe" event."""
        # a plain attribute (skip Module.__setattr__); integer ids carry no autograd history, nothing to detach
        self.__dict__["_last_ids"] = routing.expert_ids
        if recorder is not NO_RECORDER:
            recorder.record("moe", layer, scores=routing.scores.detach(), bias=self.router.bias.detach(),
                            expert_ids=self._last_ids, weights=routing.weights.detach())
        return routing

    def _can_decode_token(self, x: torch.Tensor) -> bool:
        """`_decode_token` applies: one token, `_can_fuse`, and its k experts' weights small enough to copy."""
        return x.dim() == 3 and x.shape[0] * x.shape[1] == 1 and self._gathers(1) and self._can_fuse(x)

    def _gathers(self, tokens: int) -> bool:
        """Copying the chosen experts' weights for this many tokens stays under `gather_max_elements`."""
        w1 = self._parameters["w1"]
        return tokens * self.config.top_k * 3 * w1.shape[1] * w1.shape[2] <= self.gather_max_elements

    def _can_fuse(self, x: torch.Tensor) -> bool:
        """The fused inference paths apply to x (see `_fused_weights`)."""
        return self._fused_weights(x) is not None

    def _fused_weights(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(W_in, W_out) for the fused inference paths, or None where they do not apply and the general path
        runs (what they are tested against): x [B, T, D] of float32/64, no autograd, the plain modules of K3's
        layout in x's dtype.

        W_in = [W_router; W_down; W1_shared; W3_shared] [E + l + 2 hs, D] reads x in one product; W_out =
        [W_up Diag(norm weight) | W2_shared] [D, l + hs] writes the output in one (`_output_weight`). Both are
        kept while every part has the same storage, version and dtype (`CachedWeights`: an optimiser step, a
        checkpoint load, `.to()` rebuild them). One cache for both: at decode this bookkeeping was a fifth of
        the step when done by two."""
        if x.dim() != 3 or (torch.is_grad_enabled() and self._parameters["w1"].requires_grad):
            return None
        c, mods = self.config, self._modules
        router, down, up, norm, shared = (mods["router"], mods["down"], mods["up"], mods["latent_norm"],
                                          mods["shared"])
        if (type(down) is not nn.Linear or type(up) is not nn.Linear or type(norm) is not RMSNorm
                or type(shared) is not GatedMLP or x.shape[-1] != c.hidden_size
                or c.mlp_act not in ("situ", "swiglu") or x.dtype not in (torch.float32, torch.float64)):
            return None
        inner = shared._modules
        s1, s2, s3 = inner["w1"], inner["w2"], inner["w3"]
        if type(s1) is not nn.Linear or type(s2) is not nn.Linear or type(s3) is not nn.Linear:
            return None
        if (x.dtype != self._parameters["w1"].dtype or x.dtype != router._parameters["weight"].dtype
                or autograd_needed(self.parameters())):
            return None
        return self._fused()

    def _decode_token(self, x: torch.Tensor, fused: tuple[torch.Tensor, torch.Tensor], recorder: Recorder,
                      layer: int, hooks) -> torch.Tensor:
        """`forward` for one token [1, 1, D] without autograd, in fewer ops: the same sums, another order.

        At decode every op is overhead (small: 16 of 896 experts of width 8), so: router, down projection and
        the shared experts' gate and up are one product with x; the routed and shared experts' gated
        activations one call on side-by-side rows; the latent norm's weight is folded into W_up, and
        W_up RMSNorm(y) + W2_shared h is one product with [y / rms(y) | h]. The modules are read from their
        dicts (nn.Module attribute lookup costs about a microsecond each). The reference is the general path
        (`route_tokens`, `mix_experts`, `combine`); tests compare the two.
        """
        c, mods, params = self.config, self._modules, self._parameters
        w1, w2, w3, router = params["w1"], params["w2"], params["w3"], mods["router"]
        E, m, l, hs = c.num_experts, w1.shape[1], w1.shape[2], mods["shared"]._modules["w1"].out_features
        xs = torch.mv(fused[0], x.view(-1))                                # [E + l + 2 hs]
        scores = torch.sigmoid(xs[:E].view(1, 1, E))
        if hooks is not None and hooks.changes_routing(layer):
            routing = hooks.route(layer, scores, router)
        else:  # `route` without its argument checks (the router's own settings are checked when it is built)
            ids = (scores + router._buffers["bias"]).topk(router.top_k, dim=-1, sorted=True).indices
            routing = Routing(ids, _chosen_weights(scores, ids, router.renormalize, router.scaling), scores)
        self._report(routing, recorder, layer)
        ids = routing.expert_ids.view(-1)                                  # [k] (a what-if may force another k)
        k = ids.numel()
        z = xs[E:E + l]                                                    # [l]
        rows = torch.cat([torch.mv(w1.index_select(0, ids).view(k * m, l), z), xs[E + l:E + l + hs],
                          torch.mv(w3.index_select(0, ids).view(k * m, l), z), xs[E + l + hs:]]).view(2, -1)
        h = self._glu_rows(rows)                                    # [k*m + hs]: routed, then shared; h / cap
        if m * l < self.decode_mv_min_elements:   # k small products, then their weighted sum
            every = torch.bmm(w2.index_select(0, ids), h[:k * m].view(k, m, 1))   # [k, l, 1]: W2_j h_j / cap
            y = torch.mm(routing.weights.view(1, k), every.view(k, l)).view(l)   # sum_j w_j W2_j h_j / cap
        else:                                     # one product: [W2_1 | ... | W2_k] [l, k*m] @ (w_j h_j)_j
            stacked = w2.index_select(0, ids).transpose(0, 1).reshape(l, k * m)
            y = torch.mv(stacked, h[:k * m].view(k, m).mul(routing.weights.view(k, 1)).view(-1))
        return self._decode_output(y, h[k * m:], fused[1], on_host=y.device.type == "cpu").view_as(x)

    def _decode_output(self, y: torch.Tensor, shared: torch.Tensor, out_weight: torch.Tensor,
                       on_host: bool) -> torch.Tensor:
        """W_up RMSNorm(cap y) + W2_shared (cap shared) for y [l], shared [hs] (the GLU outputs / cap) -> [D];
        out_weight = [W_up Diag(norm weight) | W2_shared] (`_fused_weights`).

        RMSNorm(cap y) = cap y / sqrt(cap^2 mean(y^2) + eps). On the CPU (`on_host`) its scale and the cap
        are the two scalars of one addmv (beta for the shared experts' part), not five ops on vectors; on a
        GPU reading the scale back would wait for the device, so there they stay tensors."""
        cap, eps, l = self._glu_cap(), self._modules["latent_norm"].eps, y.numel()
        shared_part = torch.mv(out_weight[:, l:], shared)
        if on_host:
            scale = cap / math.sqrt(cap * cap * float(torch.dot(y, y)) / l + eps)
            return torch.addmv(shared_part, out_weight[:, :l], y, beta=cap, alpha=scale)
        scale = torch.rsqrt(torch.dot(y, y) * (cap * cap / l) + eps) * cap
        return torch.addmv(shared_part * cap, out_weight[:, :l], y * scale)

    def _forward_tokens(self, x: torch.Tensor, fused: tuple[torch.Tensor, torch.Tensor], recorder: Recorder,
                        layer: int, hooks) -> torch.Tensor:
        """`forward` for many tokens [B, T, D] without autograd: router, down projection and the shared
        experts' gate and up are one product with x, W_up RMSNorm(y) + W2_shared h one product with
        [y / rms(y) | h] (the norm's weight folded into W_up, as in `_decode_token`), and the experts run in
        `_mix_token_major`. Temporaries that never leave the call live in reused buffers (`scratch_buffer`).
        The same sums as the general path, grouped otherwise; tests compare the two."""
        c, mods = self.config, self._modules
        E, l, hs = c.num_experts, c.latent_dim, mods["shared"]._modules["w1"].out_features
        n = x.shape[0] * x.shape[1]
        weight = fused[0]
        xs = torch.mm(x.reshape(n, -1), weight.t(), out=scratch_buffer("xs", (n, weight.shape[0]), x))  # [N, E+l+2hs]
        # the scores leave the call only in a recording ("moe" event); otherwise a reused buffer (no page faults)
        scores = torch.sigmoid(xs[:, :E], out=None if recorder is not NO_RECORDER else scratch_buffer("scores", (n, E), x))
        router, scores = mods["router"], scores.view(*x.shape[:-1], E)
        if hooks is not None and hooks.changes_routing(layer):
            routing = hooks.route(layer, scores, router)
        else:  # `route` with s + b written over the logits (no longer needed): one [N, E] buffer fewer
            biased = torch.add(scores, router._buffers["bias"], out=xs[:, :E].view(*x.shape[:-1], E))
            ids = top_k_ids(biased, router.top_k)
            routing = Routing(ids, _chosen_weights(scores, ids, router.renormalize, router.scaling), scores)
        self._report(routing, recorder, layer)
        k = routing.expert_ids.shape[-1]                                    # (a what-if may force another k)
        z = xs[:, E:E + l]                                                  # a view: rows of xs
        y = self._mix_token_major(z, routing.expert_ids.reshape(n, k), routing.weights.reshape(n, k))
        y = F.rms_norm(y, (l,), eps=mods["latent_norm"].eps)              # its weight is in W_out
        # the shared experts' GLU in place, on contiguous copies of their gate and up (columns of xs): the GLU's
        # eight ops on rows of stride E + l + 2hs cost twice the two copies and the ops on dense buffers
        gate = scratch_buffer("shared gate", (n, hs), x).copy_(xs[:, E + l:E + l + hs])
        up = scratch_buffer("shared up", (n, hs), x).copy_(xs[:, E + l + hs:])
        h = self._glu_(gate, up, scratch_buffer("shared sigmoid", (n, hs), x))
        return F.linear(torch.cat([y, h], -1), fused[1]).view_as(x)

    def _mix_token_major(self, z: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """`mix_experts` for ids, weights [N, k] (row n's k pairs, distinct experts), without autograd.

        Where `_samples_pay` says so (on the CPU at the presets' widths), `_mix_sampled`. Otherwise, as
        `_mix_padded`: the first `width` pairs of every expert side by side (zeros after its last), one bmm
        per product with the weights as stored; but the pairs stay in token order (each knows its column, its
        rank among the pairs of its expert), so no rows are sorted, the GLU works in place, and the k outputs
        of a token are read back as [N, k, l] and summed with their weights, without an index_add. The pairs
        past `width`, of the few busiest experts (which would pad all E), run as a second such product over
        copies of just those experts' weights; `_tier_width` picks the width that costs least.
        Where even that pads too much (E * width > pad_max_ratio * pairs) `mix_experts`' tiles run. z [N, l].
        """
        n, k = ids.shape
        E, m, l = self.w1.shape[0], self.w1.shape[1], z.shape[1]
        if n and self._samples_pay(n * k):
            return self._mix_sampled(z, ids, weights)
        flat = ids.reshape(-1)
        counts = torch.bincount(flat, minlength=E)                                  # [E]
        width, most = self._tier_width(counts) if n else (0, 0)
        if not n or E * width > self.pad_max_ratio * flat.numel():
            return self.mix_experts(z, flat, weights.reshape(-1).to(z.dtype))
        order = torch.argsort(flat, stable=True)                                    # [P] pairs by expert
        position = torch.empty_like(flat).index_copy_(0, order, torch.arange(flat.numel(), device=z.device))
        rank = (position - (torch.cumsum(counts, 0) - counts)[flat]).view(n, k)    # [N, k] column of each pair
        late = width < most                                  # late pairs: rank >= width, the second product's
        column = rank.clamp(max=width) if late else rank     # (they share one spare column, never read back)
        out = self._mix_columns(z, ids, column, width + late, (self.w1, self.w3, self.w2), "")
        if late:
            pairs = (rank >= width).view(-1).nonzero().squeeze(1)                  # [Q] token-major pair index
            busy = (counts > width).nonzero().squeeze(1)                            # [B] experts with late pairs
            slot = torch.empty_like(counts).index_copy_(0, busy, torch.arange(busy.numel(), device=z.device))
            stacks = tuple(w.index_select(0, busy) for w in (self.w1, self.w3, self.w2))
            late_out = self._mix_columns(z.index_select(0, pairs // k), slot[flat[pairs]].unsqueeze(1),
                                         (rank.view(-1)[pairs] - width).unsqueeze(1), most - width, stacks, "late ")
            out.view(-1, l).index_copy_(0, pairs, late_out.view(-1, l))
        return out.mul_(weights.to(z.dtype).unsqueeze(-1)).sum(1)

    # `_samples_pay`'s cost model in microseconds, fitted to one CPU core (small, k3-topo, tiny, mini-896/16 and
    # mini-448/8 at 16 to 256 tokens; only the ratios matter). Sampled products: per stored dot product (the
    # kernel's per-entry cost) and per multiply-add, for the 2m + l entries and 3ml multiply-adds of a pair.
    # Padded columns: per expert and product (a bmm entry) and per element of an expert matrix, plus per pair
    # the rows moved into and out of the columns and the GLU on the padding (per element of m + l).
    sampled_us_per_dot, sampled_us_per_mac = 6.7e-3, 1.7e-4
    padded_us_per_expert, padded_us_per_element, padded_us_per_pair_element = 0.3, 7.1e-4, 9e-3

    def _samples_pay(self, pairs: int) -> bool:
        """`_mix_sampled` costs less than the padded columns for this many (token, expert) pairs, by the cost
        model above (CPU only, where it was measured; elsewhere the padded columns run)."""
        w1 = self._parameters["w1"]
        if self.sampled_products is not None:
            return self.sampled_products
        if w1.device.type != "cpu":
            return False
        E, m, l = w1.shape
        sampled = pairs * (self.sampled_us_per_dot * (2 * m + l) + self.sampled_us_per_mac * 3 * m * l)
        padded = (3 * E * (self.padded_us_per_expert + self.padded_us_per_element * m * l)
                  + pairs * self.padded_us_per_pair_element * (m + l))
        return sampled < padded

    # `_sparse_rows_pay`'s cost model in microseconds (one CPU core; small, k3-topo, mini-896/16 at 256 tokens):
    # the down products as sampled products cost per entry (a dot of length m, then the k-sum); as one
    # sparse-dense product they need W2 as [E*m, l] (a copy per element, unless `_w2_rows` keeps one) and
    # cost per multiply-add.
    sampled_down_us_per_entry, transpose_us_per_element, sparse_rows_us_per_mac = 6e-3, 1.25e-3, 2e-4
    # `_w2_rows` keeps its copy of W2 between calls (tests set False to copy it on every call, as without it).
    keep_w2_rows = True

    def _sparse_rows_pay(self, pairs: int) -> bool:
        """In `_mix_sampled`, the down products cost less as H @ W2^T (a sparse-dense product with W2 as
        [E*m, l], copied unless `_w2_rows` keeps the copy) than as sampled products (P*l dot products of
        length m), by the cost model above."""
        E, l, m = self._parameters["w2"].shape
        sampled = pairs * l * self.sampled_down_us_per_entry
        copy = 0.0 if self._w2_rows_kept() else E * m * l * self.transpose_us_per_element
        return copy + pairs * m * l * self.sparse_rows_us_per_mac < sampled

    def _w2_rows_kept(self) -> bool:
        """`_w2_rows` returns a kept copy: `keep_w2_rows`, and W2 a normal tensor (an inference tensor, made
        under torch.inference_mode, has no version counter to tell when the copy would be stale)."""
        return self.keep_w2_rows and not self._parameters["w2"].is_inference()

    def _w2_rows(self, like: torch.Tensor) -> torch.Tensor:
        """W2 [E, l, m] as rows [E*m, l] (row e*m + i = W2_e[:, i]): the right operand of the down product
        H @ W2^T in `_mix_sampled`. Where `_w2_rows_kept`, a cache of the parameter (`CachedWeights`: the
        state_dict is unchanged, and the copy is rebuilt when W2's storage, version or dtype changes: an
        optimiser step, a checkpoint load, `.to()`); otherwise a copy into a reused buffer on every call.

        Memory: the cache is a second W2, a third more routed-expert memory, made only by a prefill that
        takes this product (the CPU; never at decode): small 0.46 MB per MoE layer (3.2 MB for its 7),
        mini-896/16 3.7 MB per layer (26 MB for 7), k3-topo 0.92 MB per layer (84 MB for 92), in float32.
        It saves that copy on every call: at 256 tokens ~0.15 ms of small's ~3 ms, and for mini-896/16 it
        makes this product pay at all (its sampled down products cost ~1.7 ms, the sparse-dense one ~0.8)."""
        if self._w2_rows_kept():
            return self._w2_rows_cache()
        E, l, m = self._parameters["w2"].shape
        return _rows_of_w2(self.w2, out=scratch_buffer("w2 rows", (E, m, l), like))

    def _mix_sampled(self, z: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """`mix_experts` for ids, weights [N, k] (row n's k pairs) as three sampled products, without autograd.

        A sampled product (SDDMM: a @ b computed only at the stored entries of a sparse pattern) computes
        exactly the dot products the chosen experts need, reading the expert stacks as stored (views: no
        copies, no padding, no sort): gate and up [N*k*m] are z [N, l] @ W1^T, W3^T [l, E*m] at the columns
        ids[n, j]*m + i of row n; the GLU runs on those values in place and is scaled by the pair's weight
        (w_j W2_j h_j = W2_j (w_j h_j)); the outputs are (w h) [N*k, m] @ W2^T [m, E*l] at the columns
        ids[p]*l + c of row p, summed over each token's k pairs. z [N, l] -> [N, l]."""
        n, k = ids.shape
        E, m, l = self.w1.shape
        pairs, flat, z = n * k, ids.reshape(-1, 1), z.contiguous()
        # the patterns' column indices (int64, up to megabytes) in reused buffers, as the values are
        gate_columns = torch.add(torch.arange(m, device=z.device), flat, alpha=m,
                                 out=scratch_buffer("gate columns", (pairs, m), flat)).view(-1)      # [P*m]
        rows = torch.arange(0, pairs * m + 1, k * m, device=z.device)                           # [N + 1]
        gate = _sampled(rows, gate_columns, z, self.w1.view(E * m, l).t(), "gate").view(pairs, m)
        up = _sampled(rows, gate_columns, z, self.w3.view(E * m, l).t(), "up").view(pairs, m)
        h = self._glu_(gate, up, scratch_buffer("sampled sigmoid", (pairs, m), z))
        h.mul_(weights.reshape(pairs, 1).to(z.dtype))                                           # [P, m]
        if self._sparse_rows_pay(pairs):
            # y = H @ W2^T with H [N, E*m] the (w h) values at the gate's entries: a sparse-dense product with
            # W2 as rows [E*m, l] (`_w2_rows`), which sums each token's k pairs as it goes
            return torch.mm(_csr(rows, gate_columns, h.view(-1), (n, E * m)), self._w2_rows(z))
        out_columns = torch.add(torch.arange(l, device=z.device), flat, alpha=l,
                                out=scratch_buffer("out columns", (pairs, l), flat)).view(-1)        # [P*l]
        rows = torch.arange(0, pairs * l + 1, l, device=z.device)                               # [P + 1]
        out = _sampled(rows, out_columns, h, self.w2.view(E * l, m).t(), "out")
        return out.view(n, k, l).sum(1)

    def _mix_columns(self, z: torch.Tensor, experts: torch.Tensor, column: torch.Tensor, width: int,
                     stacks: tuple[torch.Tensor, torch.Tensor, torch.Tensor], scratch: str) -> torch.Tensor:
        """E_{experts[n, j]}(z[n]) for z [N, l] and experts, column [N, j] (distinct (expert, column) pairs but
        for a spare column): each expert's rows side by side in `width` columns, one bmm per product with the
        stacks (w1, w3 [S, m, l], w2 [S, l, m]); temporaries in the scratch buffers named `scratch`. [N, j, l]."""
        w1, w3, w2 = stacks
        (S, m, l) = w1.shape
        columns = scratch_buffer(scratch + "columns", (S, l, width), z).zero_()         # Z^T per expert
        columns.transpose(1, 2)[experts, column] = z.unsqueeze(1)
        gate = torch.bmm(w1, columns, out=scratch_buffer(scratch + "gate", (S, m, width), z))
        up = torch.bmm(w3, columns, out=scratch_buffer(scratch + "up", (S, m, width), z))
        # once read, columns hold the GLU's sigmoid, then W2's output
        h = self._glu_(gate, up, columns if l >= m else None)
        return torch.bmm(w2, h, out=columns).transpose(1, 2)[experts, column]

    # `_tier_width`'s cost model in microseconds, measured on one CPU core (mini-896/16 and small at 256 tokens;
    # only the ratios matter): one expert's column of the padded products per weight element of an expert
    # matrix (m * l), and the second product's fixed cost and cost per busy expert (its copies, its ~20 ops).
    column_us_per_element = 0.15 / 1024
    late_us, late_us_per_expert = 80.0, 5.0

    def _tier_width(self, counts: torch.Tensor) -> tuple[int, int]:
        """(width, busiest count) for `_mix_token_major`: the width c of least modelled cost, E (c + 1) padded
        columns plus, for the B experts with more than c pairs, (busiest - c) columns each, their weight copies
        and the second product's ops; c = busiest (no second product) costs E * busiest columns."""
        load = torch.bincount(counts).tolist()                          # load[v]: experts with v pairs
        experts, most = counts.numel(), len(load) - 1
        column = self.column_us_per_element * self.w1.shape[1] * self.w1.shape[2]
        best, best_cost, above = most, experts * most * column, 0       # above: experts with more than c pairs
        for c in range(most - 1, 0, -1):
            above += load[c + 1]
            cost = (experts * (c + 1) + above * (most - c)) * column + self.late_us + self.late_us_per_expert * above
            if cost < best_cost:
                best, best_cost = c, cost
        return best, most

    def _glu_(self, gate: torch.Tensor, up: torch.Tensor, spare: torch.Tensor | None = None) -> torch.Tensor:
        """`_glu(gate, up)` computed in gate's and up's memory (tensors of no further use), with `spare` (at
        least as many elements, free; None: a new buffer) for the sigmoid: the same products in the same order."""
        c = self.config
        if c.mlp_act == "swiglu":
            return F.silu(gate, inplace=True).mul_(up)
        gated = torch.sigmoid(gate, out=None if spare is None else spare.view(-1)[:gate.numel()].view(gate.shape))
        gate.div_(constant(c.situ_beta_gate, gate)).tanh_().mul_(gated)
        up.div_(constant(c.situ_beta_up, up)).tanh_()
        return gate.mul_(up).mul_(constant(c.situ_beta_gate * c.situ_beta_up, gate))

    def _mix_padded(self, z: torch.Tensor, sorted_ids: torch.Tensor, token: torch.Tensor, weights: torch.Tensor,
                    counts: torch.Tensor, most: int) -> torch.Tensor:
        """`mix_experts` for pairs sorted by expert when the load is even enough: every expert gets `most`
        columns (its pairs, then zeros), so each product is one bmm with the stacked weights exactly as they
        are stored, copied nowhere: W1 [E, m, l] @ Z^T [E, l, most] (columns, not rows: a transposed weight
        operand would make torch copy all E experts first). The caller takes this path while
        E * most <= pad_max_ratio * pairs, which bounds the padding.
        z [N, l]; sorted_ids, token, weights [P] by expert; counts [E]. Returns [N, l]."""
        E, l = counts.numel(), z.shape[1]
        rank = torch.arange(sorted_ids.numel(), device=z.device) - (torch.cumsum(counts, 0) - counts)[sorted_ids]
        columns = z.new_zeros(E, l, most)                                            # Z^T per expert
        columns.transpose(1, 2)[sorted_ids, rank] = z.index_select(0, token)
        h = self._glu(self.w1 @ columns, self.w3 @ columns)                          # [E, m, most]
        out = (self.w2 @ h).transpose(1, 2)[sorted_ids, rank] * weights.unsqueeze(-1)   # [P, l]
        return z.new_zeros(z.shape[0], l).index_add(0, token, out)

    def _glu_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """`glu(rows[0], rows[1]) / _glu_cap()` for rows [2, n] (gate, up) in fewer ops: SiTU-GLU divides both
        rows by their caps at once (the same quotients as one row at a time) and leaves out the product of the
        caps (4 * 25), which `_decode_token` applies as a scalar of its last product."""
        c = self.config
        if c.mlp_act == "swiglu":
            return swiglu(rows[0], rows[1])
        caps = self._situ_caps
        if caps is None or caps.dtype != rows.dtype or caps.device != rows.device:
            with torch.inference_mode(False):
                caps = torch.tensor([[c.situ_beta_gate], [c.situ_beta_up]], dtype=rows.dtype, device=rows.device)
            self._situ_caps = caps
        capped = torch.tanh(rows / caps)                                   # [tanh(g/4); tanh(u/25)]
        return capped[0] * torch.sigmoid(rows[0]) * capped[1]

    def _glu_cap(self) -> float:
        """The factor `_glu_rows` leaves out: beta_gate * beta_up for SiTU-GLU, 1 for SwiGLU."""
        c = self.config
        return 1.0 if c.mlp_act == "swiglu" else c.situ_beta_gate * c.situ_beta_up

    def combine(self, y_latent: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The tail after the expert sum: W_up RMSNorm(y) + Shared(x). y_latent [..., l], x [..., D] -> [..., D]."""
        out = self.up(self.latent_norm(y_latent))   # RMSNorm after the full expert sum (§1c)
        return out if self.shared is None else out + self.shared(x)

    def mix_experts(self, z: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                    token: torch.Tensor | None = None) -> torch.Tensor:
        """y[n] = sum over the pairs p of row n of w[p] E_{ids[p]}(z[n]), running only the chosen experts.

        z [N, l]; ids (into this module's expert stacks), weights [P]; token [P] the row of z each pair
        belongs to, or None for token-major pairs (pair p belongs to row p // k, k = P // N). Returns [N, l].
        """
        (n_tokens, l), n_pairs = z.shape, ids.numel()
        if n_pairs == 0:
            return z.new_zeros(n_tokens, l)
        k = n_pairs // n_tokens
        if token is None and n_pairs * 3 * self.w1.shape[1] * l <= self.gather_max_elements:
            # Decode: copy each token's k experts side by side, so gate and up are one matrix-vector product
            # per token ([k*m, l] @ z); the down projection is one small product per pair, then the k-sum.
            w1 = self.w1.index_select(0, ids).view(n_tokens, -1, l)                 # [N, k*m, l]
            w3 = self.w3.index_select(0, ids).view(n_tokens, -1, l)
            rows = z.unsqueeze(-1)                                                  # [N, l, 1]
            h = self._glu(torch.bmm(w1, rows), torch.bmm(w3, rows))                # [N, k*m, 1]
            h = h.view(n_pairs, -1, 1) * weights.view(-1, 1, 1)                     # [P, m, 1]
            out = torch.bmm(self.w2.index_select(0, ids), h)                        # [P, l, 1]
            return out.view(n_tokens, k, l).sum(1)
        counts = torch.bincount(ids, minlength=self.w1.shape[0])                     # [E]
        order = torch.argsort(ids, stable=True)                                      # [P] pairs by expert
        token = order // k if token is None else token[order]                       # [P] row of each sorted pair
        most = int(counts.max())
        if counts.numel() * most <= self.pad_max_ratio * n_pairs:
            return self._mix_padded(z, ids[order], token, weights.index_select(0, order), counts, most)
        # Prefill: sort the pairs by expert and cut each expert's run into tiles of `cap` rows, cap = the mean
        # run of a used expert. Each tile is one batch entry of a bmm with its expert's weights. Tiles per
        # expert = ceil(count / cap) <= count / cap + 1, so there are at most twice as many tiles as used
        # experts and at most about twice as many rows as pairs, however skewed the routing.
        cap = -(-n_pairs // int((counts > 0).sum()))
        tiles = (counts + cap - 1) // cap                                            # [E]
        sorted_ids = ids[order]
        rank = torch.arange(n_pairs, device=z.device) - (torch.cumsum(counts, 0) - counts)[sorted_ids]
        slot = ((torch.cumsum(tiles, 0) - tiles)[sorted_ids] + rank // cap) * cap + rank % cap  # row in buffer
        tile_expert = torch.repeat_interleave(torch.arange(len(counts), device=z.device), tiles)  # [n_tiles]
        buf = z.new_zeros(len(tile_expert) * cap, l).index_copy(0, slot, z.index_select(0, token))
        buf = buf.view(len(tile_expert), cap, l)                                     # [n_tiles, cap, l]
        h = self._glu(buf @ self.w1.index_select(0, tile_expert).transpose(1, 2),
                      buf @ self.w3.index_select(0, tile_expert).transpose(1, 2))  # [n_tiles, cap, m]
        out = (h @ self.w2.index_select(0, tile_expert).transpose(1, 2)).view(-1, l)   # [n_tiles*cap, l]
        out = out.index_select(0, slot) * weights.index_select(0, order).unsqueeze(-1)  # [P, l] sorted
        return z.new_zeros(n_tokens, l).index_add(0, token, out)

    def _glu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """The experts' gated activation, `config.mlp_act` (SiTU-GLU for K3)."""
        return glu(gate, up, self.config)

    def dense_reference(self, x: torch.Tensor) -> torch.Tensor:
        """Test oracle: run ALL E experts on every token and mix with the routing weights (zeros elsewhere)."""
        routing = self.router(x)
        z = self.down(x)                                                            # [B, T, l]
        h = self._glu(torch.einsum("btl,eml->btem", z, self.w1),
                      torch.einsum("btl,eml->btem", z, self.w3))                     # [B, T, E, m]
        every = torch.einsum("btem,elm->btel", h, self.w2)                          # [B, T, E, l]
        mix = torch.zeros(routing.scores.shape, dtype=z.dtype, device=z.device)
        mix = mix.scatter(-1, routing.expert_ids, routing.weights.to(z.dtype))       # [B, T, E]
        return self.combine(torch.einsum("bte,btel->btl", mix, every), x)




_SPARSE_WARNED = False


def _sampled(rows: torch.Tensor, columns: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scratch: str) -> torch.Tensor:
    """(a @ b) at the entries of the CSR pattern (crow indices `rows`, `columns`) -> their values [nnz], in the
    scratch buffer named `scratch` (`scratch_buffer`: valid until the next call that uses that name). a [R, K]
    contiguous, b [K, C] (a transposed view of a contiguous [C, K] is read as it is, with no copy).

    torch.sparse.sampled_addmm, beta=0, with the pattern as its own output (no copy of the pattern, no fresh
    values). Its CPU kernel adds beta * (the old value), and 0 * inf or NaN is NaN, so the values start at
    zero: a NaN from an earlier call could otherwise reach this one."""
    values = scratch_buffer("sampled " + scratch, (columns.numel(),), a).zero_()
    pattern = _csr(rows, columns, values, (rows.numel() - 1, b.shape[1]))
    torch.sparse.sampled_addmm(pattern, a, b, beta=0.0, out=pattern)
    return values


def _csr(rows: torch.Tensor, columns: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A sparse CSR matrix [shape] on these tensors (no copies, no checks: the callers build valid patterns).
    torch warns once per process that sparse CSR support is "in beta"; that says nothing to a reader of this
    simulator, so the first call hides it."""
    global _SPARSE_WARNED
    if _SPARSE_WARNED:
        return torch.sparse_csr_tensor(rows, columns, values, shape, check_invariants=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        matrix = torch.sparse_csr_tensor(rows, columns, values, shape, check_invariants=False)
    _SPARSE_WARNED = True
    return matrix


def _rows_of_w2(w2: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """W2 [E, l, m] -> [E*m, l], row e*m + i = W2_e[:, i] (`LatentMoE._w2_rows`); into out [E, m, l] if given."""
    E, l, m = w2.shape
    rows = w2.transpose(1, 2).contiguous() if out is None else out.copy_(w2.transpose(1, 2))
    return rows.view(E * m, l)


def _fused_pair(router, down, w1_shared, w3_shared, up, norm, w2_shared) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights `_fused_weights` names -> (W_in [E + l + 2 hs, D], W_out [D, l + hs])."""
    return torch.cat([router, down, w1_shared, w3_shared]), _output_weight(up, norm, w2_shared)


def _output_weight(up: torch.Tensor, norm: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """[W_up Diag(norm weight) | W2 of the shared experts], [D, l + hs]: `LatentMoE.combine` as one product."""
    return torch.cat([up * norm, w2], 1)


class PlainMoE(LatentMoE):
    """The MoE of DeepSeek-V3 / K2 / Kimi Linear: LatentMoE with the latent width equal to D and the
    projections and norm taken out (z = x; out = sum_j w_j E_j(x) + Shared(x)), x [B, T, D] -> [B, T, D].

    Built as the latent MoE with identities in place of `down`, `latent_norm` and `up`, so routing, the
    sparse expert paths and `dense_reference` are shared code: what K3 added is exactly those three modules.
    State-dict keys: router.weight, router.bias, w1, w3, w2 [E, m, D] / [E, D, m], shared.* (no down/up).
    """

    def __init__(self, config: K3Config, device=None, dtype=None):
        super().__init__(dataclasses.replace(config, latent_dim=config.hidden_size), device=device, dtype=dtype)
        self.down, self.latent_norm, self.up = nn.Identity(), nn.Identity(), nn.Identity()
