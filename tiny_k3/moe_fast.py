"""The latent MoE's inference fast paths, their cost model, and the one table that picks among them.

tiny_k3/moe.py is the MoE as the math says; its general path (`route_tokens`, `mix_experts`, `combine`) and
`dense_reference` (every expert on every token) are what each path here is tested against (tests/test_moe.py:
the same outputs to 1e-12 in float64, and the same routing). Every choice of a path is made in one place,
`FastPaths.choose`, whose docstring is the decision table; a module keeps its `FastPaths` as `moe.fast`.

At these widths a decode step is per-op overhead, not arithmetic (k3-topo: 93 layers, 64 wide), and prefill
pays for copies, padding and page faults more than for multiply-adds: hence products fused over several
weights, reused scratch buffers, and sampled (SDDMM) products that compute only the chosen experts' entries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .fused import CachedWeights, autograd_needed, constant, csr_matrix, sampled_product, scratch_buffer
from .norm import RMSNorm
from .probe import NO_RECORDER, Recorder
from .topk import top_k_ids


@dataclass(frozen=True)
class CostModel:
    """What `FastPaths.choose` weighs: two bounds on copies and padding, and costs in microseconds measured on
    one CPU core (small, k3-topo, tiny, mini-896/16, mini-448/8 at 16 to 256 tokens; only the ratios matter)."""

    # decode: copy each token's k experts side by side while the copies stay below this many elements (about
    # 1 MB of fp32, the measured crossover); above it, sort the pairs by expert
    gather_max_elements: int = 1 << 18
    # padding every expert to the busiest one's count pays while it costs at most this many rows per pair
    pad_max_ratio: int = 4
    # one token's down products: one matrix-vector product over its k experts side by side from this many
    # elements of an expert's W2 (l * m) on; below it k small products (small: 128, bmm; mini-896/16: 1024)
    decode_mv_min_elements: int = 512
    # sampled products: per stored dot product and per multiply-add (2m + l entries and 3ml of them per pair)
    sampled_us_per_dot: float = 6.7e-3
    sampled_us_per_mac: float = 1.7e-4
    # padded columns: per expert and product, per element of an expert matrix, per pair and element of m + l
    padded_us_per_expert: float = 0.3
    padded_us_per_element: float = 7.1e-4
    padded_us_per_pair_element: float = 9e-3
    # the sampled path's down products: sampled (per entry), or sparse-dense with W2 as rows (a copy per
    # element of W2 unless kept, then per multiply-add)
    sampled_down_us_per_entry: float = 6e-3
    transpose_us_per_element: float = 1.25e-3
    sparse_rows_us_per_mac: float = 2e-4
    # `tier_width`: one expert's column per element of an expert matrix; the second product's fixed cost and
    # its cost per busy expert (its copies, its ~20 ops)
    column_us_per_element: float = 0.15 / 1024
    late_us: float = 80.0
    late_us_per_expert: float = 5.0

    def sampled_us(self, pairs: int, m: int, l: int) -> float:
        return pairs * (self.sampled_us_per_dot * (2 * m + l) + self.sampled_us_per_mac * 3 * m * l)

    def columns_us(self, pairs: int, experts: int, m: int, l: int) -> float:
        return (3 * experts * (self.padded_us_per_expert + self.padded_us_per_element * m * l)
                + pairs * self.padded_us_per_pair_element * (m + l))

    def sparse_rows_us(self, pairs: int, experts: int, m: int, l: int, kept: bool) -> float:
        return (0.0 if kept else experts * m * l * self.transpose_us_per_element) + pairs * m * l * self.sparse_rows_us_per_mac

    def sampled_down_us(self, pairs: int, l: int) -> float:
        return pairs * l * self.sampled_down_us_per_entry

    def tier_width(self, counts: torch.Tensor, m: int, l: int) -> tuple[int, int]:
        """(width, busiest count) for the padded columns: the width c of least modelled cost, E (c + 1) padded
        columns plus, for the B experts with more than c pairs, (busiest - c) columns each, their weight copies
        and the second product's ops; c = busiest (no second product) costs E * busiest columns."""
        load = torch.bincount(counts).tolist()                          # load[v]: experts with v pairs
        experts, most = counts.numel(), len(load) - 1
        column = self.column_us_per_element * m * l
        best, best_cost, above = most, experts * most * column, 0       # above: experts with more than c pairs
        for c in range(most - 1, 0, -1):
            above += load[c + 1]
            cost = (experts * (c + 1) + above * (most - c)) * column + self.late_us + self.late_us_per_expert * above
            if cost < best_cost:
                best, best_cost = c, cost
        return best, most


CPU_COSTS = CostModel()

# Each stage's paths, in the table's order (the last one always applies).
STAGES = {"forward": ("decode", "tokens", "general"), "experts": ("sampled", "columns"),
          "padding": ("columns", "pairs"), "pairs": ("gathered", "sorted"), "sorted": ("padded", "tiles"),
          "down": ("sparse_rows", "sampled"), "decode_down": ("one_product", "bmm")}


def pick(rows: list[tuple[str, bool, bool]], forced: str | None) -> str:
    """The path of the first row (path, applies, pays) that applies and pays; a forced path wherever it applies."""
    if forced is not None:
        for path, applies, _ in rows:
            if applies and path == forced:
                return path
    for path, applies, pays in rows:     # (a loop, not next(...): at decode this runs twice a layer)
        if applies and pays:
            return path
    raise AssertionError("the last row of every stage applies and pays")


class FastPaths:
    """One LatentMoE's fast paths: the decision table, the choices a test forces, the caches they keep.

    A plain object kept as `moe.fast` (not an nn.Module: nothing joins the state_dict). Its caches follow every
    change of the weights (`CachedWeights`: storage, in-place version, dtype), and a deep copy of the module
    copies them along with it.
    """

    def __init__(self, moe: nn.Module, costs: CostModel = CPU_COSTS):
        self.moe, self.costs = moe, costs
        self.forced: dict[str, str] = {}
        self.keep_w2_rows = True       # keep W2 as rows between calls (tests set False: a copy every call)
        self.width: int | None = None  # the padded columns' width; None: `CostModel.tier_width`'s
        # (W_in, W_out) of the fused paths (`fused_weights`) and W2 as [E*m, l] (`w2_rows`): caches
        self._fused = CachedWeights(moe, ("router", "down", "shared.w1", "shared.w3", "up", "latent_norm",
                                          "shared.w2"), _fused_pair)
        self._w2_rows = CachedWeights(moe, ("w2",), rows_of_w2, attr=None)
        self._situ_caps: torch.Tensor | None = None
        self._shared_type = type(moe.shared)   # the shared experts as built (a swapped module declines)

    def force(self, **paths: str | None) -> None:
        """Take these paths wherever they apply (stage=path; None: the table decides again), e.g.
        `moe.fast.force(forward="general")` for the reference path."""
        for stage, path in paths.items():
            if stage not in STAGES:
                raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}.")
            if path is None:
                self.forced.pop(stage, None)
            elif path not in STAGES[stage]:
                raise ValueError(f"stage {stage!r} has no path {path!r}; its paths are {', '.join(STAGES[stage])}.")
            else:
                self.forced[stage] = path

    def choose(self, stage: str, *, fused: bool = False, tokens: int = 0, token_major: bool = False, pairs: int = 0,
               experts: int = 0, width: int = 0, busiest: int = 0) -> str:
        """The decision table: which path runs at each stage, from the facts of the call. A path in `forced`
        is taken wherever it applies; otherwise the first row that applies and pays (E experts in the stack,
        m, l their widths, k = top_k, P pairs; costs: `CostModel`).

        | stage       | path        | applies where            | pays where                                   |
        |-------------|-------------|--------------------------|----------------------------------------------|
        | forward     | decode      | fused weights, 1 token   | k * 3ml <= gather_max_elements               |
        | forward     | tokens      | fused weights            | always                                       |
        | forward     | general     | always (the reference)   | always                                       |
        | experts     | sampled     | on the CPU, P > 0        | sampled_us < columns_us                      |
        | experts     | columns     | always                   | always                                       |
        | padding     | columns     | P > 0                    | E * width <= pad_max_ratio * P               |
        | padding     | pairs       | always (`mix_experts`)   | always                                       |
        | pairs       | gathered    | token-major pairs        | P * 3ml <= gather_max_elements               |
        | pairs       | sorted      | always                   | always                                       |
        | sorted      | padded      | always                   | E * busiest <= pad_max_ratio * P             |
        | sorted      | tiles       | always (any load)        | always                                       |
        | down        | sparse_rows | always                   | sparse_rows_us < sampled_down_us             |
        | down        | sampled     | always                   | always                                       |
        | decode_down | one_product | always                   | m * l >= decode_mv_min_elements              |
        | decode_down | bmm         | always                   | always                                       |
        """
        c, cost = self.moe.config, self.costs
        m, l = c.moe_intermediate, c.latent_dim
        if stage == "forward":
            rows = [("decode", fused and tokens == 1, c.top_k * 3 * m * l <= cost.gather_max_elements),
                    ("tokens", fused, True), ("general", True, True)]
        elif stage == "experts":
            on_cpu = self.moe.w1.device.type == "cpu"
            rows = [("sampled", on_cpu and pairs > 0, cost.sampled_us(pairs, m, l) < cost.columns_us(pairs, experts, m, l)),
                    ("columns", True, True)]
        elif stage == "padding":
            rows = [("columns", pairs > 0, experts * width <= cost.pad_max_ratio * pairs), ("pairs", True, True)]
        elif stage == "pairs":
            rows = [("gathered", token_major, pairs * 3 * m * l <= cost.gather_max_elements), ("sorted", True, True)]
        elif stage == "sorted":
            rows = [("padded", True, experts * busiest <= cost.pad_max_ratio * pairs), ("tiles", True, True)]
        elif stage == "down":
            kept = self.w2_rows_kept()
            rows = [("sparse_rows", True, cost.sparse_rows_us(pairs, experts, m, l, kept) < cost.sampled_down_us(pairs, l)),
                    ("sampled", True, True)]
        elif stage == "decode_down":
            rows = [("one_product", True, m * l >= cost.decode_mv_min_elements), ("bmm", True, True)]
        else:
            raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}.")
        return pick(rows, self.forced.get(stage))

    def forward_path(self, x: torch.Tensor) -> tuple[str, tuple[torch.Tensor, torch.Tensor] | None]:
        """(path, fused weights) for `LatentMoE.forward` on x [B, T, D]: "decode", "tokens" or "general"."""
        fused = self.fused_weights(x)
        tokens = x.shape[0] * x.shape[1] if fused is not None else 0
        return self.choose("forward", fused=fused is not None, tokens=tokens), fused

    def fused_weights(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(W_in, W_out) for the fused inference paths, or None where they do not apply and the general path
        runs: x [B, T, D] of float32/64, no autograd, the plain modules of K3's layout in x's dtype.

        W_in = [W_router; W_down; W1_shared; W3_shared] [E + l + 2 hs, D] reads x in one product; W_out =
        [W_up Diag(norm weight) | W2_shared] [D, l + hs] writes the output in one (`output_weight`). Both are
        kept while every part has the same storage, version and dtype (`CachedWeights`). One cache for both:
        at decode this bookkeeping was a fifth of the step when done by two. (The modules are read from their
        dicts: nn.Module attribute lookup costs about a microsecond each.)"""
        moe = self.moe
        w1 = moe._parameters["w1"]
        if x.dim() != 3 or (torch.is_grad_enabled() and (w1.requires_grad or x.requires_grad)):
            return None   # (a frozen MoE still passes gradients on to x: the general path, which autograd follows)
        c, mods = moe.config, moe._modules
        down, up, norm, shared = mods["down"], mods["up"], mods["latent_norm"], mods.get("shared")
        if (type(down) is not nn.Linear or type(up) is not nn.Linear or type(norm) is not RMSNorm
                or shared is None or x.shape[-1] != c.hidden_size
                or c.mlp_act not in ("situ", "swiglu") or x.dtype not in (torch.float32, torch.float64)):
            return None
        inner = shared._modules
        if type(shared) is not self._shared_type or any(type(inner[name]) is not nn.Linear for name in ("w1", "w2", "w3")):
            return None
        if (x.dtype != w1.dtype or x.dtype != mods["router"]._parameters["weight"].dtype
                or autograd_needed(moe.parameters())):
            return None
        return self._fused()

    def _route(self, scores: torch.Tensor, biased_out: torch.Tensor | None, recorder: Recorder, layer: int, hooks):
        """`Router.choose` without its argument checks (the router's own settings are checked when it is
        built), s + b written into `biased_out` where given (a buffer of no further use); reported."""
        router = self.moe._modules["router"]
        if hooks is not None and hooks.changes_routing(layer):
            routing = hooks.route(layer, scores, router)
        else:
            biased = torch.add(scores, router._buffers["bias"], out=biased_out)
            routing = router.routing_for(scores, top_k_ids(biased, router.top_k))
        return self.moe.record_routing(routing, recorder, layer)

    def decode_token(self, x: torch.Tensor, fused: tuple[torch.Tensor, torch.Tensor], recorder: Recorder,
                     layer: int, hooks) -> torch.Tensor:
        """`forward` for one token [1, 1, D] without autograd, in fewer ops: the same sums, another order.

        At decode every op is overhead (small: 16 of 896 experts of width 8), so: router, down projection and
        the shared experts' gate and up are one product with x; the routed and shared experts' gated
        activations one call on side-by-side rows; the latent norm's weight is folded into W_up, and
        W_up RMSNorm(y) + W2_shared h is one product with [y / rms(y) | h] (`decode_output`)."""
        moe = self.moe
        c, mods, params = moe.config, moe._modules, moe._parameters
        w1, w2, w3 = params["w1"], params["w2"], params["w3"]
        E, m, l, hs = c.num_experts, w1.shape[1], w1.shape[2], mods["shared"]._modules["w1"].out_features
        xs = torch.mv(fused[0], x.view(-1))                                # [E + l + 2 hs]
        routing = self._route(torch.sigmoid(xs[:E].view(1, 1, E)), None, recorder, layer, hooks)
        ids = routing.expert_ids.view(-1)                                  # [k] (a what-if may force another k)
        k = ids.numel()
        z = xs[E:E + l]                                                    # [l]
        rows = torch.cat([torch.mv(w1.index_select(0, ids).view(k * m, l), z), xs[E + l:E + l + hs],
                          torch.mv(w3.index_select(0, ids).view(k * m, l), z), xs[E + l + hs:]]).view(2, -1)
        h = self.glu_rows(rows)                                      # [k*m + hs]: routed, then shared; h / cap
        if self.choose("decode_down") == "bmm":   # k small products, then their weighted sum
            every = torch.bmm(w2.index_select(0, ids), h[:k * m].view(k, m, 1))   # [k, l, 1]: W2_j h_j / cap
            y = torch.mm(routing.weights.view(1, k), every.view(k, l)).view(l)   # sum_j w_j W2_j h_j / cap
        else:                                     # one product: [W2_1 | ... | W2_k] [l, k*m] @ (w_j h_j)_j
            stacked = w2.index_select(0, ids).transpose(0, 1).reshape(l, k * m)
            y = torch.mv(stacked, h[:k * m].view(k, m).mul(routing.weights.view(k, 1)).view(-1))
        return self.decode_output(y, h[k * m:], fused[1], on_host=y.device.type == "cpu").view_as(x)

    def decode_output(self, y: torch.Tensor, shared: torch.Tensor, out_weight: torch.Tensor,
                      on_host: bool) -> torch.Tensor:
        """W_up RMSNorm(cap y) + W2_shared (cap shared) for y [l], shared [hs] (the GLU outputs / cap) -> [D];
        out_weight = [W_up Diag(norm weight) | W2_shared] (`fused_weights`).

        RMSNorm(cap y) = cap y / sqrt(cap^2 mean(y^2) + eps). On the CPU (`on_host`) its scale and the cap
        are the two scalars of one addmv (beta for the shared experts' part), not five ops on vectors; on a
        GPU reading the scale back would wait for the device, so there they stay tensors."""
        cap, eps, l = self.glu_cap(), self.moe._modules["latent_norm"].eps, y.numel()
        shared_part = torch.mv(out_weight[:, l:], shared)
        if on_host:
            scale = cap / math.sqrt(cap * cap * float(torch.dot(y, y)) / l + eps)
            return torch.addmv(shared_part, out_weight[:, :l], y, beta=cap, alpha=scale)
        scale = torch.rsqrt(torch.dot(y, y) * (cap * cap / l) + eps) * cap
        return torch.addmv(shared_part * cap, out_weight[:, :l], y * scale)

    def forward_tokens(self, x: torch.Tensor, fused: tuple[torch.Tensor, torch.Tensor], recorder: Recorder,
                       layer: int, hooks) -> torch.Tensor:
        """`forward` for many tokens [B, T, D] without autograd: router, down projection and the shared
        experts' gate and up are one product with x, W_up RMSNorm(y) + W2_shared h one product with
        [y / rms(y) | h] (the norm's weight folded into W_up, as in `decode_token`), and the experts run in
        `mix_token_major`. Temporaries that never leave the call live in reused buffers (`scratch_buffer`)."""
        c, mods = self.moe.config, self.moe._modules
        E, l, hs = c.num_experts, c.latent_dim, mods["shared"]._modules["w1"].out_features
        n = x.shape[0] * x.shape[1]
        weight = fused[0]
        xs = torch.mm(x.reshape(n, -1), weight.t(), out=scratch_buffer("xs", (n, weight.shape[0]), x))  # [N, E+l+2hs]
        # the scores leave the call only in a recording ("moe" event); otherwise a reused buffer (no page faults)
        scores = torch.sigmoid(xs[:, :E], out=None if recorder is not NO_RECORDER else scratch_buffer("scores", (n, E), x))
        # s + b is written over the logits (no longer needed): one [N, E] buffer fewer
        routing = self._route(scores.view(*x.shape[:-1], E), xs[:, :E].view(*x.shape[:-1], E), recorder, layer, hooks)
        k = routing.expert_ids.shape[-1]                                    # (a what-if may force another k)
        z = xs[:, E:E + l]                                                  # a view: rows of xs
        y = self.mix_token_major(z, routing.expert_ids.reshape(n, k), routing.weights.reshape(n, k))
        y = F.rms_norm(y, (l,), eps=mods["latent_norm"].eps)              # its weight is in W_out
        # the shared experts' GLU in place, on contiguous copies of their gate and up (columns of xs): the GLU's
        # eight ops on rows of stride E + l + 2hs cost twice the two copies and the ops on dense buffers
        gate = scratch_buffer("shared gate", (n, hs), x).copy_(xs[:, E + l:E + l + hs])
        up = scratch_buffer("shared up", (n, hs), x).copy_(xs[:, E + l + hs:])
        h = self.glu_(gate, up, scratch_buffer("shared sigmoid", (n, hs), x))
        return F.linear(torch.cat([y, h], -1), fused[1]).view_as(x)

    def mix_token_major(self, z: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """`mix_experts` for ids, weights [N, k] (row n's k pairs, distinct experts), without autograd.

        "sampled": `mix_sampled`. "columns": as the padded path of `mix_experts`, the first `width` pairs of
        every expert side by side (zeros after its last), one bmm per product with the weights as stored; but
        the pairs stay in token order (each knows its column, its rank among the pairs of its expert), so no
        rows are sorted, the GLU works in place, and the k outputs of a token are read back as [N, k, l] and
        summed with their weights, without an index_add. The pairs past `width`, of the few busiest experts
        (which would pad all E), run as a second such product over copies of just those experts' weights.
        Where even that pads too much, `mix_experts` itself. z [N, l] -> [N, l]."""
        moe = self.moe
        n, k = ids.shape
        E, m, l = moe.w1.shape[0], moe.w1.shape[1], z.shape[1]
        flat = ids.reshape(-1)
        if self.choose("experts", pairs=flat.numel(), experts=E) == "sampled":
            return self.mix_sampled(z, ids, weights)
        counts = torch.bincount(flat, minlength=E)                                  # [E]
        width, most = self.costs.tier_width(counts, m, l) if n else (0, 0)
        width = width if self.width is None else min(self.width, most)
        if self.choose("padding", pairs=flat.numel(), experts=E, width=width) == "pairs":
            return moe.mix_experts(z, flat, weights.reshape(-1).to(z.dtype))
        order = torch.argsort(flat, stable=True)                                    # [P] pairs by expert
        position = torch.empty_like(flat).index_copy_(0, order, torch.arange(flat.numel(), device=z.device))
        rank = (position - (torch.cumsum(counts, 0) - counts)[flat]).view(n, k)    # [N, k] column of each pair
        late = width < most                                  # late pairs: rank >= width, the second product's
        column = rank.clamp(max=width) if late else rank     # (they share one spare column, never read back)
        out = self.mix_columns(z, ids, column, width + late, (moe.w1, moe.w3, moe.w2), "")
        if late:
            pairs = (rank >= width).view(-1).nonzero().squeeze(1)                  # [Q] token-major pair index
            busy = (counts > width).nonzero().squeeze(1)                            # [B] experts with late pairs
            slot = torch.empty_like(counts).index_copy_(0, busy, torch.arange(busy.numel(), device=z.device))
            stacks = tuple(w.index_select(0, busy) for w in (moe.w1, moe.w3, moe.w2))
            late_out = self.mix_columns(z.index_select(0, pairs // k), slot[flat[pairs]].unsqueeze(1),
                                        (rank.view(-1)[pairs] - width).unsqueeze(1), most - width, stacks, "late ")
            out.view(-1, l).index_copy_(0, pairs, late_out.view(-1, l))
        return out.mul_(weights.to(z.dtype).unsqueeze(-1)).sum(1)

    def mix_columns(self, z: torch.Tensor, experts: torch.Tensor, column: torch.Tensor, width: int,
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
        h = self.glu_(gate, up, columns if l >= m else None)
        return torch.bmm(w2, h, out=columns).transpose(1, 2)[experts, column]

    def mix_gathered(self, z: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """`mix_experts` for token-major pairs (ids, weights [P], k = P // N per row of z [N, l]) by copying each
        token's k experts side by side: gate and up are one matrix-vector product per token ([k*m, l] @ z),
        the down projection one small product per pair, then the k-sum. [N, l]."""
        moe = self.moe
        (n_tokens, l), n_pairs = z.shape, ids.numel()
        w1 = moe.w1.index_select(0, ids).view(n_tokens, -1, l)                  # [N, k*m, l]
        w3 = moe.w3.index_select(0, ids).view(n_tokens, -1, l)
        rows = z.unsqueeze(-1)                                                  # [N, l, 1]
        h = moe.expert_glu(torch.bmm(w1, rows), torch.bmm(w3, rows))          # [N, k*m, 1]
        h = h.view(n_pairs, -1, 1) * weights.view(-1, 1, 1)                     # [P, m, 1]
        out = torch.bmm(moe.w2.index_select(0, ids), h)                         # [P, l, 1]
        return out.view(n_tokens, n_pairs // n_tokens, l).sum(1)

    def mix_padded(self, z: torch.Tensor, sorted_ids: torch.Tensor, token: torch.Tensor, weights: torch.Tensor,
                   counts: torch.Tensor, most: int) -> torch.Tensor:
        """`mix_experts` for pairs sorted by expert when the load is even enough: every expert gets `most`
        columns (its pairs, then zeros), so each product is one bmm with the stacked weights exactly as they
        are stored, copied nowhere: W1 [E, m, l] @ Z^T [E, l, most] (columns, not rows: a transposed weight
        operand would make torch copy all E experts first). The "sorted" row bounds the padding.
        z [N, l]; sorted_ids, token, weights [P] by expert; counts [E]. Returns [N, l]."""
        moe = self.moe
        E, l = counts.numel(), z.shape[1]
        rank = torch.arange(sorted_ids.numel(), device=z.device) - (torch.cumsum(counts, 0) - counts)[sorted_ids]
        columns = z.new_zeros(E, l, most)                                            # Z^T per expert
        columns.transpose(1, 2)[sorted_ids, rank] = z.index_select(0, token)
        h = moe.expert_glu(moe.w1 @ columns, moe.w3 @ columns)                       # [E, m, most]
        out = (moe.w2 @ h).transpose(1, 2)[sorted_ids, rank] * weights.unsqueeze(-1)   # [P, l]
        return z.new_zeros(z.shape[0], l).index_add(0, token, out)

    def glu_(self, gate: torch.Tensor, up: torch.Tensor, spare: torch.Tensor | None = None) -> torch.Tensor:
        """`expert_glu(gate, up)` computed in gate's and up's memory (tensors of no further use), with `spare`
        (at least as many elements, free; None: a new buffer) for the sigmoid: the same products in the same
        order."""
        c = self.moe.config
        if c.mlp_act == "swiglu":
            return F.silu(gate, inplace=True).mul_(up)
        gated = torch.sigmoid(gate, out=None if spare is None else spare.view(-1)[:gate.numel()].view(gate.shape))
        gate.div_(constant(c.situ_beta_gate, gate)).tanh_().mul_(gated)
        up.div_(constant(c.situ_beta_up, up)).tanh_()
        return gate.mul_(up).mul_(constant(c.situ_beta_gate * c.situ_beta_up, gate))

    def glu_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """`expert_glu(rows[0], rows[1]) / glu_cap()` for rows [2, n] (gate, up) in fewer ops: SiTU-GLU divides
        both rows by their caps at once (the same quotients as one row at a time) and leaves out the product of
        the caps (4 * 25), which `decode_output` applies as a scalar of its last product."""
        c = self.moe.config
        if c.mlp_act == "swiglu":
            return F.silu(rows[0]) * rows[1]
        caps = self._situ_caps
        if caps is None or caps.dtype != rows.dtype or caps.device != rows.device:
            with torch.inference_mode(False):
                caps = torch.tensor([[c.situ_beta_gate], [c.situ_beta_up]], dtype=rows.dtype, device=rows.device)
            self._situ_caps = caps
        capped = torch.tanh(rows / caps)                                   # [tanh(g/4); tanh(u/25)]
        return capped[0] * torch.sigmoid(rows[0]) * capped[1]

    def glu_cap(self) -> float:
        """The factor `glu_rows` leaves out: beta_gate * beta_up for SiTU-GLU, 1 for SwiGLU."""
        c = self.moe.config
        return 1.0 if c.mlp_act == "swiglu" else c.situ_beta_gate * c.situ_beta_up

    def w2_rows_kept(self) -> bool:
        """`w2_rows` returns a kept copy: `keep_w2_rows`, and W2 a normal tensor (an inference tensor, made
        under torch.inference_mode, has no version counter to tell when the copy would be stale)."""
        return self.keep_w2_rows and not self.moe._parameters["w2"].is_inference()

    def w2_rows(self, like: torch.Tensor) -> torch.Tensor:
        """W2 [E, l, m] as rows [E*m, l] (row e*m + i = W2_e[:, i]): the right operand of the down product
        H @ W2^T in `mix_sampled`. Where `w2_rows_kept`, a cache of the parameter (`CachedWeights`: the
        state_dict is unchanged, and the copy is rebuilt when W2's storage, version or dtype changes);
        otherwise a copy into a reused buffer on every call.

        Memory: the cache is a second W2, a third more routed-expert memory, made only by a prefill that
        takes this product (the CPU; never at decode): small 0.46 MB per MoE layer (3.2 MB for its 7),
        mini-896/16 3.7 MB per layer (26 MB for 7), k3-topo 0.92 MB per layer (84 MB for 92), in float32.
        It saves that copy on every call: at 256 tokens ~0.15 ms of small's ~3 ms, and for mini-896/16 it
        makes this product pay at all (its sampled down products cost ~1.7 ms, the sparse-dense one ~0.8)."""
        if self.w2_rows_kept():
            return self._w2_rows()
        E, l, m = self.moe._parameters["w2"].shape
        return rows_of_w2(self.moe.w2, out=scratch_buffer("w2 rows", (E, m, l), like))

    def mix_sampled(self, z: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """`mix_experts` for ids, weights [N, k] (row n's k pairs) as three sampled products, without autograd.

        A sampled product (SDDMM: a @ b computed only at the stored entries of a sparse pattern) computes
        exactly the dot products the chosen experts need, reading the expert stacks as stored (views: no
        copies, no padding, no sort): gate and up [N*k*m] are z [N, l] @ W1^T, W3^T [l, E*m] at the columns
        ids[n, j]*m + i of row n; the GLU runs on those values in place and is scaled by the pair's weight
        (w_j W2_j h_j = W2_j (w_j h_j)); the outputs are (w h) [N*k, m] @ W2^T [m, E*l] at the columns
        ids[p]*l + c of row p, summed over each token's k pairs. z [N, l] -> [N, l]."""
        moe = self.moe
        n, k = ids.shape
        E, m, l = moe.w1.shape
        pairs, flat, z = n * k, ids.reshape(-1, 1), z.contiguous()
        # the patterns' column indices (int64, up to megabytes) in reused buffers, as the values are
        gate_columns = torch.add(torch.arange(m, device=z.device), flat, alpha=m,
                                 out=scratch_buffer("gate columns", (pairs, m), flat)).view(-1)      # [P*m]
        rows = torch.arange(0, pairs * m + 1, k * m, device=z.device)                           # [N + 1]
        gate = sampled_product(rows, gate_columns, z, moe.w1.view(E * m, l).t(), "gate").view(pairs, m)
        up = sampled_product(rows, gate_columns, z, moe.w3.view(E * m, l).t(), "up").view(pairs, m)
        h = self.glu_(gate, up, scratch_buffer("sampled sigmoid", (pairs, m), z))
        h.mul_(weights.reshape(pairs, 1).to(z.dtype))                                           # [P, m]
        if self.choose("down", pairs=pairs, experts=E) == "sparse_rows":
            # y = H @ W2^T with H [N, E*m] the (w h) values at the gate's entries: a sparse-dense product with
            # W2 as rows [E*m, l] (`w2_rows`), which sums each token's k pairs as it goes
            return torch.mm(csr_matrix(rows, gate_columns, h.view(-1), (n, E * m)), self.w2_rows(z))
        out_columns = torch.add(torch.arange(l, device=z.device), flat, alpha=l,
                                out=scratch_buffer("out columns", (pairs, l), flat)).view(-1)        # [P*l]
        rows = torch.arange(0, pairs * l + 1, l, device=z.device)                               # [P + 1]
        out = sampled_product(rows, out_columns, h, moe.w2.view(E * l, m).t(), "out")
        return out.view(n, k, l).sum(1)


def rows_of_w2(w2: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """W2 [E, l, m] -> [E*m, l], row e*m + i = W2_e[:, i] (`FastPaths.w2_rows`); into out [E, m, l] if given."""
    E, l, m = w2.shape
    rows = w2.transpose(1, 2).contiguous() if out is None else out.copy_(w2.transpose(1, 2))
    return rows.view(E * m, l)


def _fused_pair(router, down, w1_shared, w3_shared, up, norm, w2_shared) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights `FastPaths.fused_weights` names -> (W_in [E + l + 2 hs, D], W_out [D, l + hs])."""
    return torch.cat([router, down, w1_shared, w3_shared]), output_weight(up, norm, w2_shared)


def output_weight(up: torch.Tensor, norm: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """[W_up Diag(norm weight) | W2 of the shared experts], [D, l + hs]: `LatentMoE.combine` as one product."""
    return torch.cat([up * norm, w2], 1)
