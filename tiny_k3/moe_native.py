"""The latent MoE's expert products by the C kernels of tiny_k3/moe_native.c, as autograd Functions.

`mix_experts_native` computes what `LatentMoE.mix_experts` computes, y[n] = sum over the pairs p of token n of
w_p W2_e glu(W1_e z_n, W3_e z_n), with the two products in C and the activation between them:

    g, u = ExpertsIn(z, W1, W3)        [P, m] each, pairs in expert order     (C, forward and backward)
    h = glu(g, u)                      element-wise: moe.glu, which takes `SituGLU` (C) for K3's SiTU-GLU
    y = ExpertsOut(h, W2, w)           [N, l], summed per token                (C, forward and backward)

The router's training path takes `sigmoid_top_k_ids_native`: its sigmoid and its selection, topk(scores + bias), in
one C pass per row (a checked floor, then the few candidates ranked); `top_k_ids_native` is the same selection on
scores already made. `chosen_scores_backward` is `moe.ChosenScores`' backward in C.

Part of the opt-in compiled path (tiny_k3/compiled.py): `LatentMoE.mix_experts` and the router's training path take
them while TINY_K3_COMPILE is on, on the CPU, in float32 or float64. Equal to the PyTorch path to float rounding,
outputs and every gradient, and the selection exactly (tests/test_native.py, float64 and float32).
"""

from __future__ import annotations

import torch

from . import native
from .native import pointers


def expert_order(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [P] (in 0 .. E-1) -> (order [P]: the pairs by expert, stably, as `torch.argsort(ids, stable=True)`;
    starts [E + 1]: expert e's pairs are order[starts[e]:starts[e + 1]]), by a counting sort in C."""
    ids = ids.contiguous()
    if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < num_experts):   # the C writes by these ids
        raise ValueError(f"expert ids must lie in 0..{num_experts - 1}, got {int(ids.min())}..{int(ids.max())}.")
    order, starts = torch.empty_like(ids), torch.empty(num_experts + 1, dtype=torch.long)
    native.library(torch.float32, "moe").order_by_expert(ids.numel(), num_experts, *pointers(ids, starts, order))
    return order, starts


class ExpertsIn(torch.autograd.Function):
    """(z [N, l], W1, W3 [E, m, l]; token [P], starts [E + 1]) -> (g, u) [P, m]: g_p = W1_e z_token[p], u_p likewise,
    pairs in expert order."""

    @staticmethod
    def forward(ctx, z, w1, w3, token, starts):
        E, m, l = w1.shape
        z, w1, w3 = z.contiguous(), w1.contiguous(), w3.contiguous()
        g, u = z.new_empty(token.numel(), m), z.new_empty(token.numel(), m)
        w1t, w3t = w1.transpose(1, 2).contiguous(), w3.transpose(1, 2).contiguous()     # [E, l, m]: see the C
        native.library(z.dtype, "moe").experts_in(E, m, l, *pointers(starts, token, z, w1t, w3t, g, u))
        ctx.save_for_backward(z, w1, w3, token, starts)
        return g, u

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dg, du):
        z, w1, w3, token, starts = ctx.saved_tensors
        E, m, l = w1.shape
        dg, du = dg.contiguous(), du.contiguous()     # (autograd gives zeros, not None, for an unused output)
        dz, dw1, dw3 = torch.zeros_like(z), torch.zeros_like(w1), torch.zeros_like(w3)
        native.library(z.dtype, "moe").experts_in_backward(E, m, l, *pointers(starts, token, z, w1, w3, dg, du,
                                                                                dz, dw1, dw3))
        return dz, dw1, dw3, None, None


class ExpertsOut(torch.autograd.Function):
    """(h [P, m], W2 [E, l, m], w [P]; token [P], starts [E + 1], N) -> y [N, l]: y[n] = sum of w_p W2_e h_p over the
    pairs of token n, pairs in expert order."""

    @staticmethod
    def forward(ctx, h, w2, w, token, starts, n_tokens: int):
        E, l, m = w2.shape
        h, w2, w = h.contiguous(), w2.contiguous(), w.contiguous()
        y, w2t = h.new_zeros(n_tokens, l), w2.transpose(1, 2).contiguous()               # [E, m, l]: see the C
        native.library(h.dtype, "moe").experts_out(E, m, l, *pointers(starts, token, h, w2t, w, y))
        ctx.save_for_backward(h, w2, w2t, w, token, starts)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        h, w2, w2t, w, token, starts = ctx.saved_tensors
        E, l, m = w2.shape
        dy = dy.contiguous()
        dh, dw2, dw = torch.empty_like(h), torch.zeros_like(w2), torch.empty_like(w)
        native.library(h.dtype, "moe").experts_out_backward(E, m, l, *pointers(starts, token, h, w2, w2t, w, dy,
                                                                                 dh, dw2, dw))
        return dh, dw2, dw, None, None, None


class SituGLU(torch.autograd.Function):
    """(g, u; bg, bu) -> h = situ_glu(g, u, bg, bu), same shape, element by element in C, forward and backward."""

    @staticmethod
    def forward(ctx, g, u, beta_gate: float, beta_up: float):
        g, u = g.contiguous(), u.to(g.dtype).contiguous()
        h = torch.empty_like(g)
        native.library(g.dtype, "moe").situ_glu_forward(g.numel(), beta_gate, beta_up, *pointers(g, u, h))
        ctx.save_for_backward(g, u)
        ctx.betas = beta_gate, beta_up
        return h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dh):
        g, u = ctx.saved_tensors
        dh = dh.to(g.dtype).contiguous()
        dg, du = torch.empty_like(g), torch.empty_like(u)
        native.library(g.dtype, "moe").situ_glu_backward(g.numel(), *ctx.betas, *pointers(g, u, dh, dg, du))
        return dg, du, None, None


def mix_experts_native(moe, z: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                       token: torch.Tensor | None = None) -> torch.Tensor:
    """`moe.mix_experts(z, ids, weights, token)` (a LatentMoE) with the expert products in C. z [N, l]; ids,
    weights [P]; token [P] or None (token-major pairs: p belongs to row p // (P / N)). Returns [N, l]."""
    n_tokens, n_pairs = z.shape[0], ids.numel()
    order, starts = expert_order(ids, moe.w1.shape[0])
    token = order // (n_pairs // n_tokens) if token is None else token[order]
    gate, up = ExpertsIn.apply(z, moe.w1, moe.w3, token, starts)
    hidden = moe.expert_glu(gate, up)
    return ExpertsOut.apply(hidden, moe.w2, weights.index_select(0, order), token, starts, n_tokens)


def chosen_scores_backward(ids: torch.Tensor, grad_logits: torch.Tensor, x: torch.Tensor,
                           weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`ChosenScores`' backward in C: ids, grad_logits [N, k] (dL/d(logit) at the chosen experts), x [N, D], weight
    [E, D] -> (dL/dx [N, D], dL/dW [E, D]), a gather and a scatter of k rows of W per token."""
    ids, grad_logits, x, weight = (t.contiguous() for t in (ids, grad_logits.to(x.dtype), x, weight))
    dx, dw = torch.empty_like(x), torch.zeros_like(weight)
    native.library(x.dtype, "moe").chosen_scores_backward(x.shape[0], x.shape[1], ids.shape[1],
                                                          *pointers(ids, grad_logits, x, weight, dx, dw))
    return dx, dw


def top_k_ids_native(scores: torch.Tensor, bias: torch.Tensor, k: int) -> torch.Tensor:
    """`(scores + bias).topk(k, dim=-1, sorted=True).indices` exactly, by the C selection (`top_k_rows`): scores
    [..., E], bias [E] -> [..., k] long. Rows the C pass marks (a tie among the k + 1 largest, a NaN) are handed to
    torch's topk, so ties break exactly as topk breaks them."""
    rows = scores.detach().reshape(-1, scores.shape[-1]).contiguous()
    return _select(rows, bias, k, "top_k_rows").view(*scores.shape[:-1], k)


def sigmoid_top_k_ids_native(logits: torch.Tensor, bias: torch.Tensor, k: int) -> torch.Tensor:
    """The router's scores and selection in one C pass (`top_k_sigmoid_rows`): logits [N, E] (contiguous, no
    autograd history) become sigmoid(logits) in place, and the result is `top_k_ids_native` of those scores."""
    if not logits.is_contiguous() or logits.dim() != 2:
        raise ValueError(f"sigmoid_top_k_ids_native writes the scores in place: logits must be a contiguous [N, E], "
                         f"got shape {list(logits.shape)}.")
    return _select(logits, bias, k, "top_k_sigmoid_rows")


def _select(rows: torch.Tensor, bias: torch.Tensor, k: int, kernel: str) -> torch.Tensor:
    n, E = rows.shape
    bias = bias.detach().to(rows.dtype).contiguous()
    ids = torch.empty(n, k, dtype=torch.long)
    redo = torch.empty(n, dtype=torch.uint8)
    kept, kept_ids = rows.new_empty(k + 1), torch.empty(k + 1, dtype=torch.long)        # scratch (see the C)
    vals, cand, cand_ids = rows.new_empty(E), rows.new_empty(E), torch.empty(E, dtype=torch.long)
    getattr(native.library(rows.dtype, "moe"), kernel)(n, E, k, *pointers(rows, bias, ids, redo, kept, kept_ids,
                                                                          vals, cand, cand_ids))
    if bool(redo.any()):
        again = redo.nonzero().squeeze(1)
        ids[again] = (rows[again] + bias).topk(k, dim=-1, sorted=True).indices
    return ids


def available(z: torch.Tensor) -> str | None:
    """Why `mix_experts_native` cannot take z here (a GPU, a dtype, no C compiler), or None: it can."""
    if z.device.type != "cpu":
        return "the C kernels run on the CPU"
    return native.problem(z.dtype, "moe")
