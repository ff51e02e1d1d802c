"""Latent MoE: a sigmoid router with a selection bias, top-k routed experts in a latent width, shared experts.

K3's MoE sublayer (k3_facts.md §1c, §2, §3b), for x [B, T, D]:

    s = sigmoid(W_r x)                      router affinities in fp32 on the full-width x        [B, T, E]
    ids = topk(s + b, k)                    b = e_score_correction_bias: selection only           [B, T, k]
    w = s[ids] / sum(s[ids]) * scaling      weights from the *unbiased* scores                    [B, T, k]
    z = W_down x                            D -> latent l (K3: 7168 -> 3584)                       [B, T, l]
    y = sum_j w_j E_j(z)                    E_j(z) = W2_j situ_glu(W1_j z, W3_j z), l -> m -> l   [B, T, l]
    out = W_up RMSNorm(y) + Shared(x)       norm after the full sum; shared experts at width D    [B, T, D]

Only the k chosen experts of each token are computed (see `LatentMoE.mix_experts`). This module is the math,
in forward order; the inference fast paths, their cost model and the one table that picks among them are in
tiny_k3/moe_fast.py (`LatentMoE.fast`), `top_k_ids` in tiny_k3/topk.py.

`PlainMoE` is the MoE of DeepSeek-V3, K2 and Kimi Linear (`moe_kind="plain"`): the same router and experts
with no latent: z = x, E_j: D -> m -> D, out = y + Shared(x) (docs/lineage.md §1).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from . import compiled, moe_native
from .config import K3Config
from .fused import autograd_needed, constant, scratch_buffer
from .moe_fast import FastPaths
from .norm import RMSNorm
from .probe import NO_RECORDER, Recorder
from .topk import top_k_ids


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
    return Routing(expert_ids, chosen_weights(scores, expert_ids, renormalize, scaling), scores)


def chosen_weights(scores: torch.Tensor, expert_ids: torch.Tensor, renormalize: bool, scaling: float) -> torch.Tensor:
    """The chosen experts' unbiased scores [..., k], divided by their sum + 1e-20 (when k > 1: see `route`) and
    times `scaling` (`mixing_weights` of scores.gather(-1, expert_ids))."""
    return mixing_weights(scores.gather(-1, expert_ids), renormalize, scaling)


def mixing_weights(chosen: torch.Tensor, renormalize: bool, scaling: float) -> torch.Tensor:
    """chosen [..., k]: the chosen experts' unbiased scores -> their weights: divided by their sum + 1e-20 (when
    k > 1: see `route`), times `scaling`.
    (The constants are tensors of the scores' dtype: the same numbers as Python floats, without a cast per op.)"""
    weights = chosen
    if renormalize and chosen.shape[-1] > 1:
        weights = weights / weights.sum(-1, keepdim=True).add_(constant(1e-20, weights))
    if scaling != 1.0:
        weights = weights * constant(scaling, weights)
    return weights


def situ_glu(gate: torch.Tensor, up: torch.Tensor, beta_gate: float = 4.0, beta_up: float = 25.0) -> torch.Tensor:
    """K3's SiTU-GLU (k3_facts.md §1c): h = [4 tanh(g/4) sigmoid(g)] * [25 tanh(u/25)], |h| < 100.

    A soft-capped SwiGLU: beta*tanh(x/beta) ~ x for |x| << beta, so for small inputs h ~ silu(g) * u,
    while for large ones the gate stays below beta_gate and the up branch below beta_up in magnitude.
    """
    if torch.compiler.is_compiling():      # plain numbers: torch.compile folds them (and cannot trace the cache)
        g, u, scale = beta_gate, beta_up, beta_gate * beta_up
    else:                                  # eager: tensor constants, no scalar wrapped per op
        g, u, scale = constant(beta_gate, gate), constant(beta_up, up), constant(beta_gate * beta_up, gate)
    return torch.tanh(gate / g) * torch.sigmoid(gate) * torch.tanh(up / u) * scale


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU (Shazeer 2020, arXiv:2002.05202), the GLU of DeepSeek-V3, K2 and Kimi Linear: h = silu(g) * u.

    silu(g) = g * sigmoid(g): unbounded, which is what SiTU-GLU's two soft caps change (docs/lineage.md §1; k3_facts.md §1c).
    """
    return F.silu(gate) * up


def glu(gate: torch.Tensor, up: torch.Tensor, config: K3Config) -> torch.Tensor:
    """The gated activation `config.mlp_act` names: "situ" (K3's SiTU-GLU) or "swiglu" (K2, Kimi Linear).

    While training on the compiled path (tiny_k3/compiled.py) SiTU-GLU runs in C (moe_native.SituGLU: one pass
    each way), or where the C kernels cannot, as one compiled op: its seven element-wise passes, and their
    backward, fused."""
    if config.mlp_act == "swiglu":
        return swiglu(gate, up)
    if compiled.enabled() and autograd_needed((gate, up)):
        if gate.shape == up.shape and gate.dtype == up.dtype and moe_native.available(gate) is None:   # in C
            return moe_native.SituGLU.apply(gate, up, config.situ_beta_gate, config.situ_beta_up)
        return _SITU_GLU(gate, up, config.situ_beta_gate, config.situ_beta_up)
    return situ_glu(gate, up, config.situ_beta_gate, config.situ_beta_up)


_SITU_GLU = compiled.op("situ_glu", situ_glu)


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


class ChosenScores(torch.autograd.Function):
    """s[n, ids[n]] = sigmoid(x_n . W_{ids[n, j]}) [N, k], whose backward works only at the k chosen experts.

    x [N, D], weight [E, D], scores [N, E] = sigmoid(x W^T) computed without autograd (the selection needs them
    all), ids [N, k]. The forward is a gather: the same numbers as the full-width scores. The loss depends on the
    scores through the k chosen of each row only (the weights; the selection is piecewise constant), so the
    full-width backward (dL/ds [N, E] zero but for k entries, sigmoid's backward and two products over all E:
    `Router.full_width`) does E/k = 56 times the work needed. With a = x W^T and g = dL/ds_chosen [N, k]:

        dL/da = g * s (1 - s)                          sigmoid' from its output, at the chosen entries    [N, k]
        dL/dx_n = sum_j dL/da_nj W_{ids[n, j]}         an embedding bag: k rows of W, weighted             [N, D]
        dL/dW_e = sum_{(n, j): ids[n, j] = e} dL/da_nj x_n    a sparse [E, N] (k entries per column) @ x   [E, D]
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        chosen = scores.gather(-1, ids)
        ctx.save_for_backward(x, weight, ids, chosen)
        ctx.in_c = compiled.enabled() and x.dtype == weight.dtype and moe_native.available(x) is None
        return chosen

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, weight, ids, chosen = ctx.saved_tensors
        grad_logits = grad * chosen * (1 - chosen)                                         # [N, k]
        if ctx.in_c:                  # the compiled path: both in one C pass (moe_native.chosen_scores_backward)
            return (*moe_native.chosen_scores_backward(ids, grad_logits, x, weight), None, None)
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_x = F.embedding_bag(ids, weight, per_sample_weights=grad_logits, mode="sum")
        if ctx.needs_input_grad[1]:
            tokens = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1).expand_as(ids)
            pairs = torch.sparse_coo_tensor(torch.stack([ids, tokens]).view(2, -1), grad_logits.reshape(-1),
                                            (weight.shape[0], ids.shape[0]), check_invariants=False)   # [E, N]
            grad_weight = torch.sparse.mm(pairs, x)
        return grad_x, grad_weight, None, None


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

        `hooks` (tiny_k3.hooks.Hooks) may block, force or unbias this layer's selection; None: as trained.
        With autograd the scores of all E experts are computed without it (they only select) and the weights
        carry the gradient through the k chosen scores alone (`ChosenScores`): the same values and, to float
        rounding, the same gradients as `full_width`, its reference."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        x, weight = x.to(dtype), self.weight.to(dtype)
        if not autograd_needed((x, weight)):
            return self.choose(torch.sigmoid(F.linear(x, weight)), hooks, layer)
        with torch.no_grad():
            scores = F.linear(x, weight)                                 # [..., E] logits, no autograd history
            if hooks is not None and hooks.changes_routing(layer):
                ids = hooks.route(layer, scores.sigmoid_(), self).expert_ids
            elif compiled.enabled() and moe_native.available(scores) is None:   # sigmoid and top-k, one C pass
                ids = moe_native.sigmoid_top_k_ids_native(scores.view(-1, scores.shape[-1]), self.bias,
                                                          self.top_k).view(*scores.shape[:-1], self.top_k)
            else:   # s + b in a reused buffer: it only selects (a fresh [N, E] costs its page faults)
                scores.sigmoid_()
                biased = torch.add(scores, self.bias, out=scratch_buffer("router biased", scores.shape, scores))
                ids = top_k_ids(biased, self.top_k)
        k = ids.shape[-1]
        chosen = ChosenScores.apply(x.reshape(-1, x.shape[-1]), weight, scores.view(-1, scores.shape[-1]),
                                    ids.reshape(-1, k)).view(ids.shape)
        return Routing(ids, mixing_weights(chosen, self.renormalize, self.scaling), scores)

    def full_width(self, x: torch.Tensor, hooks=None, layer: int = 0) -> Routing:
        """`forward` as the math reads, the reference of its training path: with autograd, the gradient flows
        through the scores of all E experts (all but k per row get a zero)."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        return self.choose(torch.sigmoid(F.linear(x.to(dtype), self.weight.to(dtype))), hooks, layer)

    def choose(self, scores: torch.Tensor, hooks=None, layer: int = 0) -> Routing:
        """The selection from the affinities scores [..., E] (what `forward` does after the sigmoid)."""
        if hooks is not None and hooks.changes_routing(layer):
            return hooks.route(layer, scores, self)
        return route(scores, self.bias, self.top_k, self.renormalize, self.scaling)

    def routing_for(self, scores: torch.Tensor, expert_ids: torch.Tensor) -> Routing:
        """The Routing of these chosen experts [..., k] (chosen by `route`, or forced by a what-if): their weights
        from the unbiased scores [..., E], renormalised and scaled as this router's are (`chosen_weights`)."""
        return Routing(expert_ids, chosen_weights(scores, expert_ids, self.renormalize, self.scaling), scores)

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
    the test oracle for the sparse forward. `fast` (moe_fast.FastPaths) holds the inference fast paths and
    their decision table; `fast.force(forward="general")` runs the general path alone.
    """

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
        # the inference fast paths and the table that picks them (tiny_k3/moe_fast.py): a plain object, no state
        self.fast = FastPaths(self)

    def forward(self, x: torch.Tensor, recorder: Recorder = NO_RECORDER, layer: int = 0, hooks=None) -> torch.Tensor:
        """x [B, T, D] -> [B, T, D]. `hooks`: routing changes for a what-if (tiny_k3.hooks), None: none.

        Without autograd `fast.forward_path` may pick a fused inference path (one token, or many: the same sums
        grouped otherwise); the general path below is what they are tested against."""
        path, fused = self.fast.forward_path(x)
        if path == "decode":
            return self.fast.decode_token(x, fused, recorder, layer, hooks)
        if path == "tokens":
            return self.fast.forward_tokens(x, fused, recorder, layer, hooks)
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
        return self.record_routing(self.router(x, hooks, layer), recorder, layer)

    def record_routing(self, routing: Routing, recorder: Recorder, layer: int) -> Routing:
        """Keep the ids for `last_load` (counted lazily) and send the "moe" event; returns `routing`."""
        # a plain attribute (skip Module.__setattr__); integer ids carry no autograd history, nothing to detach
        self.__dict__["_last_ids"] = routing.expert_ids
        if recorder is not NO_RECORDER:
            recorder.record("moe", layer, scores=routing.scores.detach(), bias=self.router.bias.detach(),
                            expert_ids=routing.expert_ids, weights=routing.weights.detach())
        return routing

    def mix_experts(self, z: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                    token: torch.Tensor | None = None) -> torch.Tensor:
        """y[n] = sum over the pairs p of row n of w[p] E_{ids[p]}(z[n]), running only the chosen experts.

        z [N, l]; ids (into this module's expert stacks), weights [P]; token [P] the row of z each pair
        belongs to, or None for token-major pairs (pair p belongs to row p // k, k = P // N). Returns [N, l].

        The pairs are sorted by expert and each expert's run is cut into tiles of `cap` rows, cap = the mean
        run of a used expert; each tile is one batch entry of a bmm with its expert's weights. Tiles per
        expert = ceil(count / cap) <= count / cap + 1, so there are at most twice as many tiles as used
        experts and at most about twice as many rows as pairs, however skewed the routing. Where the table
        (`fast.choose`) says so, few token-major pairs copy their experts instead, and an even load pads
        every expert to the busiest one (moe_fast.py).
        """
        (n_tokens, l), n_pairs = z.shape, ids.numel()
        if n_pairs == 0:
            return z.new_zeros(n_tokens, l)
        if compiled.enabled() and (problem := moe_native.available(z)) is None:   # the opt-in compiled path
            return moe_native.mix_experts_native(self, z, ids, weights, token)
        if compiled.enabled():
            compiled.fall_back("the MoE's expert products (C)", problem)
        if self.fast.choose("pairs", token_major=token is None, pairs=n_pairs) == "gathered":
            return self.fast.mix_gathered(z, ids, weights)
        counts = torch.bincount(ids, minlength=self.w1.shape[0])                     # [E]
        order = torch.argsort(ids, stable=True)                                      # [P] pairs by expert
        token = order // (n_pairs // n_tokens) if token is None else token[order]   # [P] row of each sorted pair
        sorted_ids, sorted_weights = ids[order], weights.index_select(0, order)
        most = int(counts.max())
        if self.fast.choose("sorted", pairs=n_pairs, experts=counts.numel(), busiest=most) == "padded":
            return self.fast.mix_padded(z, sorted_ids, token, sorted_weights, counts, most)
        cap = -(-n_pairs // int((counts > 0).sum()))
        tiles = (counts + cap - 1) // cap                                            # [E]
        rank = torch.arange(n_pairs, device=z.device) - (torch.cumsum(counts, 0) - counts)[sorted_ids]
        slot = ((torch.cumsum(tiles, 0) - tiles)[sorted_ids] + rank // cap) * cap + rank % cap  # row in buffer
        tile_expert = torch.repeat_interleave(torch.arange(len(counts), device=z.device), tiles)  # [n_tiles]
        buf = z.new_zeros(len(tile_expert) * cap, l).index_copy(0, slot, z.index_select(0, token))
        buf = buf.view(len(tile_expert), cap, l)                                     # [n_tiles, cap, l]
        h = self.expert_glu(buf @ self.w1.index_select(0, tile_expert).transpose(1, 2),
                            buf @ self.w3.index_select(0, tile_expert).transpose(1, 2))  # [n_tiles, cap, m]
        out = (h @ self.w2.index_select(0, tile_expert).transpose(1, 2)).view(-1, l)   # [n_tiles*cap, l]
        out = out.index_select(0, slot) * sorted_weights.unsqueeze(-1)               # [P, l] sorted
        return z.new_zeros(n_tokens, l).index_add(0, token, out)

    def expert_glu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """The experts' gated activation, `config.mlp_act` (SiTU-GLU for K3)."""
        return glu(gate, up, self.config)

    def combine(self, y_latent: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The tail after the expert sum: W_up RMSNorm(y) + Shared(x). y_latent [..., l], x [..., D] -> [..., D]."""
        out = self.up(self.latent_norm(y_latent))   # RMSNorm after the full expert sum (§1c)
        return out if self.shared is None else out + self.shared(x)

    def dense_reference(self, x: torch.Tensor) -> torch.Tensor:
        """Test oracle: run ALL E experts on every token and mix with the routing weights (zeros elsewhere)."""
        routing = self.router(x)
        z = self.down(x)                                                            # [B, T, l]
        h = self.expert_glu(torch.einsum("btl,eml->btem", z, self.w1),
                            torch.einsum("btl,eml->btem", z, self.w3))               # [B, T, E, m]
        every = torch.einsum("btem,elm->btel", h, self.w2)                          # [B, T, E, l]
        mix = torch.zeros(routing.scores.shape, dtype=z.dtype, device=z.device)
        mix = mix.scatter(-1, routing.expert_ids, routing.weights.to(z.dtype))       # [B, T, E]
        return self.combine(torch.einsum("bte,btel->btl", mix, every), x)

    @property
    def last_load(self) -> torch.Tensor:
        """[E] float: tokens routed to each expert in the last forward (zeros before the first)."""
        if self._last_ids is None:
            return torch.zeros(self.config.num_experts, device=self.w1.device)
        return torch.bincount(self._last_ids.reshape(-1), minlength=self.config.num_experts).float()


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
