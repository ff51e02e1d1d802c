"""Kimi Delta Attention (KDA): the gated delta rule with a per-key-channel decay.

Per head the memory is a matrix S [K, V] (key-major). Each token decays the rows of S by
alpha_t = exp(g_t) (one factor per key channel), then writes v_t under key k_t with the delta
rule (kda.md §1):

    S' = Diag(exp g_t) S_{t-1};   S_t = S' + beta_t k_t (v_t - S'^T k_t)^T;   o_t = S_t^T (scale q_t)

`kda_recurrent` is that definition, token by token. `kda_chunked` computes the same thing a chunk
at a time with the WY/UT form (kda.md §2): everything inside a chunk is a few batched matmuls and
a triangular inverse, and only the state is carried from chunk to chunk. `KDALayer` wraps it with
the projections, short convolutions, gates and output norm of Kimi Linear / K3 (kda.md §3).

Layout (fla, time-major): q, k, g [B,T,H,K]; v [B,T,H,V]; beta [B,T,H]; state [B,H,K,V].
The state is accumulated in float32 (float64 when the inputs are float64).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .cache import KDAState
from .config import K3Config
from .fused import CachedCat, FusedLinears, autograd_needed
from .probe import NO_RECORDER, Recorder


# ---------------------------------------------------------------------------- helpers
def _compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 when any input is float64, else float32 (bf16/fp16 inputs are upcast)."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _check_inputs(fn: str, q, k, v, g, beta, initial_state) -> tuple[int, int, int, int, int]:
    """Shape checks at the boundary of kda_recurrent / kda_chunked; returns (B, T, H, K, V)."""
    if q.dim() != 4:
        raise ValueError(f"{fn}: q must have shape [B, T, H, K], got {list(q.shape)}.")
    B, T, H, K = q.shape
    if v.dim() != 4 or tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"{fn}: v must have shape [B, T, H, V] = [{B}, {T}, {H}, V], got {list(v.shape)}.")
    V = v.shape[-1]
    expected = {"k": (q.shape, k), "g": (q.shape, g), "beta": ((B, T, H), beta)}
    for name, (shape, t) in expected.items():
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{fn}: {name} must have shape {list(shape)}, got {list(t.shape)}.")
    if initial_state is not None and tuple(initial_state.shape) != (B, H, K, V):
        raise ValueError(f"{fn}: initial_state must have shape [B, H, K, V] = {[B, H, K, V]}, "
                         f"got {list(initial_state.shape)}.")
    return B, T, H, K, V


# ---------------------------------------------------------------------------- gate
def kda_gate(g_raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
             lower_bound: float | None = None) -> torch.Tensor:
    """Log decay g [B,T,H,K] from the raw gate projection (kda.md §3).

    g_raw [B,T,H,K], A_log [H], dt_bias [H*K].
      no bound:   g = -exp(A_log) * softplus(g_raw + dt_bias)          (g <= 0, unbounded below)
      with bound: g = lower_bound * sigmoid(exp(A_log) * (g_raw + dt_bias))   (lower_bound < g < 0)
    Computed in float32 (float64 for float64 inputs).
    """
    if g_raw.dim() != 4:
        raise ValueError(f"kda_gate: g_raw must have shape [B, T, H, K], got {list(g_raw.shape)}.")
    H, K = g_raw.shape[-2:]
    if tuple(A_log.shape) != (H,):
        raise ValueError(f"kda_gate: A_log must have shape [H] = [{H}], got {list(A_log.shape)}.")
    if tuple(dt_bias.shape) != (H * K,):
        raise ValueError(f"kda_gate: dt_bias must have shape [H*K] = [{H * K}], got {list(dt_bias.shape)}.")
    dtype = _compute_dtype(g_raw, A_log, dt_bias)
    x = g_raw.to(dtype) + dt_bias.to(dtype).view(H, K)
    a = A_log.to(dtype).exp().view(H, 1)
    if lower_bound is None:
        return -a * F.softplus(x)  # torch's softplus: beta 1, threshold 20, as fla/HF
    return lower_bound * torch.sigmoid(a * x)


# ---------------------------------------------------------------------------- recurrent form
def kda_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
                  scale: float | None = None, initial_state: torch.Tensor | None = None,
                  output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The definition, one token at a time (kda.md §1). Returns (o [B,T,H,V] in q's dtype, state [B,H,K,V] or None).

    q, k, g [B,T,H,K]; v [B,T,H,V]; beta [B,T,H]; initial_state [B,H,K,V] (zeros when None).
    q and k are used as given; scale defaults to K**-0.5.
    """
    B, T, H, K, V = _check_inputs("kda_recurrent", q, k, v, g, beta, initial_state)
    scale = K ** -0.5 if scale is None else scale
    out_dtype, dtype = q.dtype, _compute_dtype(q, k, v, g, beta, initial_state)
    q, k, v, g, beta = (t.to(dtype) for t in (q, k, v, g, beta))
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(dtype)
    outputs = []
    for t in range(T):
        k_t = k[:, t]                                              # [B,H,K]
        S = S * g[:, t].exp().unsqueeze(-1)                        # S' = Diag(alpha_t) S: decay the key rows
        recalled = torch.einsum("bhk,bhkv->bhv", k_t, S)           # S'^T k_t: what the memory returns for k_t
        delta = beta[:, t, :, None] * (v[:, t] - recalled)         # beta_t (v_t - S'^T k_t)
        S = S + k_t.unsqueeze(-1) * delta.unsqueeze(-2)            # rank-1 write under k_t
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
    o = torch.stack(outputs, 1) if outputs else v.new_zeros(B, 0, H, V)
    return o.to(out_dtype), (S if output_final_state else None)


def kda_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
             scale: float | None = None, initial_state: torch.Tensor | None = None,
             output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`kda_recurrent` for one token (T = 1), the decode step: same arguments, same result, fewer ops.

    The three contractions are batched matmuls over B*H (k^T S', the rank-1 write, S^T q) instead of
    einsums, and nothing is stacked: at decode sizes every op is overhead.
    """
    B, T, H, K, V = _check_inputs("kda_step", q, k, v, g, beta, initial_state)
    if T != 1:
        raise ValueError(f"kda_step: takes exactly one token (T = 1), got T = {T}; use kda_chunked for more.")
    scale = K ** -0.5 if scale is None else scale
    out_dtype, dtype = q.dtype, _compute_dtype(q, k, v, g, beta, initial_state)
    q, k, v, g = (t.to(dtype).reshape(B * H, 1, -1) for t in (q, k, v, g))   # [BH, 1, K or V]
    S = (q.new_zeros(B * H, K, V) if initial_state is None else initial_state.to(dtype).reshape(B * H, K, V))
    S = S * g.mT.exp()                                         # S' = Diag(alpha) S
    delta = (v - k @ S) * beta.to(dtype).reshape(B * H, 1, 1)   # beta (v - S'^T k)   [BH, 1, V]
    S = torch.baddbmm(S, k.mT, delta)                          # S' + k delta^T
    o = (q @ S) * scale                                        # S^T (scale q)        [BH, 1, V]
    return o.view(B, 1, H, V).to(out_dtype), (S.view(B, H, K, V) if output_final_state else None)


# ---------------------------------------------------------------------------- chunked form
_SUB_CHUNK = 16  # sub-chunk length for chunks whose decay is too strong to factor at once (fla also uses 16)


def _max_safe_spread(dtype: torch.dtype) -> float:
    """The widest range of Γ (one key channel, one chunk) that the factored products can take.

    Factored, each factor is exp(±(Γ - ref)) with ref mid-range, so at most exp(spread / 2), about
    exp(20) in float32. The kept (i <= r) products are true values exp(Γ_r - Γ_i) <= 1.
    """
    # Halved: the backward multiplies a factor by its partner once more (d/dΓ of x e^(Γ-ref) through the
    # product with k e^(ref-Γ)), so both must fit together; the full log-range gave inf gradients (NaN
    # after clipping) for decays of about -1 per token over 64-token chunks.
    return (math.log(torch.finfo(dtype).max) - 8.0) / 2


def _chunk_products(rows: tuple[torch.Tensor, ...], k: torch.Tensor, G: torch.Tensor) -> list[torch.Tensor]:
    """Decayed products inside each chunk (kda.md §2): for each x in rows, Σ_d x_rd k_id e^(Γ_rd - Γ_id).

    rows: tensors [M, C, K] (here β⊙K and Q); k, G [M, C, K]. Returns one [M, C, C] per row tensor;
    only the entries i <= r are meaningful (the caller keeps the lower triangle).

    Fast path: e^(Γ_r - Γ_i) = e^(Γ_r - ref) e^(ref - Γ_i), so each sum is one matmul per chunk; with
    ref in the middle of Γ's range the factors stay finite while that range is below
    `_max_safe_spread`. Chunks with a faster-decaying channel go through `_split_products`.
    """
    hi, lo = G.amax(-2, keepdim=True), G.amin(-2, keepdim=True)          # [M, 1, K]
    ref = ((hi + lo) / 2).detach()  # the exact result does not depend on ref: no gradient through it
    bad = (hi - lo).detach().amax(-1).squeeze(-1) > _max_safe_spread(G.dtype)   # [M]
    if not bad.any():
        return _factored_products(rows, k, G, ref)
    M, C, _ = G.shape
    out = [k.new_zeros(M, C, C) for _ in rows]
    good, bad = (~bad).nonzero().squeeze(-1), bad.nonzero().squeeze(-1)
    for idx, part in [(good, _factored_products([x[good] for x in rows], k[good], G[good], ref[good])),
                      (bad, _split_products([x[bad] for x in rows], k[bad], G[bad]))]:
        for o, p in zip(out, part):
            o[idx] = p
    return out


def _factored_products(rows, k, G, ref) -> list[torch.Tensor]:
    up = (G - ref).exp()                                       # e^(Γ_r - ref)
    k_down = (k * up.reciprocal()).transpose(-1, -2)           # k_i e^(ref - Γ_i), as [K, C]
    return [(x * up) @ k_down for x in rows]


def _split_products(rows, k: torch.Tensor, G: torch.Tensor) -> list[torch.Tensor]:
    """`_chunk_products` for chunks whose decay is too strong to factor in one piece (g <= 0 assumed).

    Between 16-token sub-chunks, factor at E_j = Γ at the end of the earlier sub-chunk j: for i in j
    and r after it, e^(Γ_r - Γ_i) = e^(Γ_r - E_j) e^(E_j - Γ_i) with both factors <= 1, always safe.
    Inside a sub-chunk: `_chunk_products` again, and pair by pair where even that range is too
    wide, masking i > r *before* the exp (kda.md §2, Numerics).
    """
    M, C, K = G.shape
    s = _SUB_CHUNK
    if C <= s or C % s:
        later = torch.ones(C, C, dtype=torch.bool, device=G.device).triu(1)     # i > r
        decay = (G.unsqueeze(-2) - G.unsqueeze(-3)).masked_fill(later.unsqueeze(-1), float("-inf")).exp()
        decay_k = decay * k.unsqueeze(-3)                                       # [M, r, i, K]
        return [torch.einsum("mrid,mrd->mri", decay_k, x) for x in rows]
    nb = C // s
    E = G[:, s - 1::s].detach()                                                 # [M, nb, K]: Γ at sub-chunk ends
    after = torch.arange(C, device=G.device) // s > torch.arange(nb, device=G.device).unsqueeze(-1)  # [nb, C]
    decay_r = (G.unsqueeze(1) - E.unsqueeze(2)).masked_fill(~after.unsqueeze(-1), float("-inf")).exp()
    cols = (k.view(M, nb, s, K) * (E.unsqueeze(2) - G.view(M, nb, s, K)).exp()).transpose(-1, -2)
    out = [((x.unsqueeze(1) * decay_r) @ cols)                                # [M, nb (j), C (r), s (i in j)]
           .permute(0, 2, 1, 3).reshape(M, C, C) for x in rows]               # zero on and above the diagonal blocks
    inside = _chunk_products([x.reshape(M * nb, s, K) for x in rows], k.reshape(M * nb, s, K), G.reshape(M * nb, s, K))
    for o, block in zip(out, inside):                                          # the diagonal blocks
        o.view(M, nb, s, nb, s).diagonal(dim1=1, dim2=3).copy_(block.view(M, nb, s, s).permute(0, 2, 3, 1))
    return out


def _unit_lower_inverse(A: torch.Tensor) -> torch.Tensor:
    """(I + A)^-1 for strictly lower-triangular A [M, C, C] (the UT transform's inverse, kda.md §2).

    One batched triangular solve against the identity (unitriangular=True reads A's zero diagonal as
    ones): forward substitution, stable for any A. On torch 2.13's CPU build this is 3-4x faster than
    the 16x16 block substitution with matmuls it replaced, and it has autograd.
    """
    M, C, _ = A.shape
    eye = torch.eye(C, dtype=A.dtype, device=A.device).expand(M, C, C)
    return torch.linalg.solve_triangular(A, eye, upper=False, unitriangular=True)


def kda_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
                scale: float | None = None, initial_state: torch.Tensor | None = None,
                output_final_state: bool = False, chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same arguments and result as `kda_recurrent`, computed a chunk at a time (WY/UT form, kda.md §2).

    For a chunk of C tokens with starting state S0 and inclusive in-chunk cumsum Γ of g:
        A = strict_tril(β_r Σ_d k_rd k_id e^(Γ_rd-Γ_id)),  P = tril(Σ_d q_rd k_id e^(Γ_rd-Γ_id))
        W = (I+A)^-1 Diag(β) (K ⊙ e^Γ),  U0 = (I+A)^-1 Diag(β) V,  U = U0 - W S0
        O = (Q ⊙ e^Γ) S0 + P U,   S_C = Diag(e^Γ_C) S0 + (K ⊙ e^(Γ_C - Γ))^T U
    Everything but U, O and S_C is computed for all chunks at once; the loop over chunks carries
    only the state. T need not be a multiple of chunk_size: the tail is padded with k = v = beta = 0
    and g = 0 (no write, no decay), and the padding is dropped.

    Two implementations of these equations, both equal to `kda_recurrent`: `_chunked_factored` when every
    decay range can be factored around its chunk's end (the usual case), at chunk_size or, where the decay
    is too strong for that, at chunk_size / 2, / 4, ... down to 16; else `_chunked_general` at chunk_size
    (sub-chunks, and pair-by-pair products where even those are too wide).
    """
    B, T, H, K, V = _check_inputs("kda_chunked", q, k, v, g, beta, initial_state)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"kda_chunked: chunk_size must be a positive integer, got {chunk_size!r}.")
    if T == 0:
        return kda_recurrent(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                             output_final_state=output_final_state)
    scale = K ** -0.5 if scale is None else scale
    out_dtype, dtype = q.dtype, _compute_dtype(q, k, v, g, beta, initial_state)
    S = (q.new_zeros(B * H, K, V, dtype=dtype) if initial_state is None
         else initial_state.to(dtype).reshape(B * H, K, V))
    # Adaptive chunks: where the decay over a chunk is too wide to factor, halve the chunk (down to the
    # sub-chunk length) before giving up on the factored form: fewer tokens, a narrower range. Any chunk
    # length gives the same result; the factored form at C/2 is about twice as fast as the general one at C.
    C, general = chunk_size, None
    while True:
        chunks = _Chunker(B, T, H, C, dtype)
        G = _chunk_cumsum(chunks(g))                           # [M, C, K]: Γ_r = g_1 + ... + g_r, per chunk
        to_end = G[:, -1:] - G                                 # Γ_C - Γ_r (<= 0 when g <= 0)
        lo, hi = torch.aminmax(to_end.detach())                # one range for all chunks: a sufficient check
        if float(hi - lo) <= _max_safe_spread(dtype):
            o, S = _chunked_factored(chunks, q, k, v, beta, G, to_end, S, scale)
            break
        general = (chunks, G) if general is None else general  # the general form runs at the chunk asked for
        if C <= _SUB_CHUNK or C % 2:
            chunks, G = general
            o, S = _chunked_general(chunks, q, k, v, beta, G, S, scale)
            break
        C //= 2
    o = o.view(chunks.N, B, H, chunks.C, V).permute(1, 0, 3, 2, 4).reshape(B, -1, H, V)[:, :T]
    return o.to(out_dtype), (S.view(B, H, K, V) if output_final_state else None)


class _Chunker:
    """[B,T,H,D] or [B,T,H] -> chunk-major [M = N*B*H, C, D] (D = 1 for beta) in one copy, zero-padded tail.

    `transposed=True` gives [M, D, C] instead, at the same cost: either way the copy reads with strides.
    """

    def __init__(self, B: int, T: int, H: int, C: int, dtype: torch.dtype):
        self.B, self.T, self.H, self.C, self.N, self.dtype = B, T, H, C, -(-T // C), dtype

    def __call__(self, x: torch.Tensor, transposed: bool = False) -> torch.Tensor:
        B, H, C, N = self.B, self.H, self.C, self.N
        x = x.unsqueeze(-1) if x.dim() == 3 else x
        if N * C > self.T:
            x = F.pad(x, (0, 0, 0, 0, 0, N * C - self.T))
        x = x.to(self.dtype).view(B, N, C, H, -1)
        x = x.permute(1, 0, 3, 4, 2) if transposed else x.permute(1, 0, 3, 2, 4)
        return x.reshape(N * B * H, *x.shape[-2:])


def _chunk_cumsum(g: torch.Tensor) -> torch.Tensor:
    """Inclusive cumsum over each chunk, g [M, C, K] -> [M, C, K], as one product with the lower-triangular
    ones: on CPU, torch's cumsum along a middle dimension is about twice as slow as this matmul."""
    C = g.shape[1]
    return torch.ones(C, C, dtype=g.dtype, device=g.device).tril() @ g


def _chunked_factored(chunks: _Chunker, q, k, v, beta, G, to_end, S, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk equations with every decay factored around the chunk end (kda.md §2) -> (O [M,C,V], final S).

    e^(Γ_r - Γ_i) = e^(Γ_r - Γ_C) e^(Γ_C - Γ_i), so with q↑ = Q ⊙ e^(Γ-Γ_C), k↑ = Diag(β) K ⊙ e^(Γ-Γ_C) and
    k↓ = K ⊙ e^(Γ_C-Γ) the products are plain matmuls, A = strict_tril(k↑ k↓^T), P = tril(q↑ k↓^T), and the
    same factors serve the rest once the carried state is taken decayed over the chunk, S~ = Diag(e^Γ_C) S0:
        W~ = (I+A)^-1 k↑,  U = U0 - W~ S~,  O = scale (q↑ S~ + P U),  S_C = S~ + k↓^T U.
    Every factor is finite while the range of Γ_C - Γ is below `_max_safe_spread` (the caller checks).
    """
    e = to_end.exp()                                           # [M, C, K] e^(Γ_C - Γ)
    k_t, beta = chunks(k, transposed=True), chunks(beta)       # [M, K, C], [M, C, 1]
    k_down_t = k_t * e.mT                                      # [M, K, C] k↓^T, contiguous: it feeds three matmuls
    k_up = (beta / e) * k_t.mT                                 # [M, C, K] (the first operand sets the layout)
    q_up = chunks(q) / e
    A = (k_up @ k_down_t).tril_(-1)
    P = (q_up @ k_down_t).tril_()
    T_inv = _unit_lower_inverse(A)                             # UT transform: (I + A)^-1
    W = T_inv @ k_up
    U0 = T_inv @ (chunks(v) * beta)
    decay = G[:, -1:].mT.exp()                                 # [M, K, 1] e^Γ_C: S0's rows decayed over the chunk
    starts, U, S = _carry_state(chunks.N, W, U0, k_down_t, decay, S, keep_decayed=True)
    return (q_up @ starts).baddbmm_(P, U).mul_(scale), S


def _chunked_general(chunks: _Chunker, q, k, v, beta, G, S, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk equations as written, for decay too strong to factor around the chunk end (-> O, final S).

    The products go through `_chunk_products` (factored around mid-range where that is safe, else in
    sub-chunks or pair by pair); everything else uses e^Γ <= 1 and e^(Γ_C - Γ) <= 1 directly.
    """
    q, k, v, beta = chunks(q), chunks(k), chunks(v), chunks(beta)
    k_beta = k * beta
    A, P = _chunk_products((k_beta, q), k, G)
    A = A.tril(-1)                                            # A[r,i] = β_r Σ_d k_rd k_id e^(Γ_rd - Γ_id), i < r
    P = P.tril()                                              # P[r,i] = Σ_d q_rd k_id e^(Γ_rd - Γ_id), i <= r
    T_inv = _unit_lower_inverse(A)
    eG = G.exp()
    W = T_inv @ (k_beta * eG)                                 # W = (I+A)^-1 Diag(β) (K ⊙ e^Γ)
    U0 = T_inv @ (v * beta)                                   # U0 = (I+A)^-1 Diag(β) V
    G_end = G[:, -1:]
    k_out_t = (k * (G_end - G).exp()).mT                      # [K, C]: writes decayed to the chunk end
    decay = G_end.mT.exp()                                    # [K, 1]: rows of S0 decayed to the chunk end
    starts, U, S = _carry_state(chunks.N, W, U0, k_out_t, decay, S, keep_decayed=False)
    return (q * eG @ starts).baddbmm_(P, U).mul_(scale), S     # O = scale ((Q ⊙ e^Γ) S0 + P U)


def _carry_state(N: int, W, U0, k_out_t, decay, S, keep_decayed: bool):
    """The only sequential part: carry the state across the N chunks, 2 matmuls per chunk.

    Per chunk n: X = decay S;  U = U0 - W Y;  S <- X + k_out_t U, with Y = X (`keep_decayed`, the factored
    form) or Y = S (the general form). W, U0 [M, C, .], k_out_t [M, K, C], decay [M, K, 1], chunk-major
    (M = N*BH); S [BH, K, V]. Returns (Y per chunk [M, K, V], U [M, C, V], the state after the last chunk).
    Without autograd the per-chunk results go straight into their buffers (`out=`); with it, into lists.
    """
    W, U0, k_out_t, decay = (t.view(N, -1, *t.shape[1:]) for t in (W, U0, k_out_t, decay))
    if torch.is_grad_enabled() and any(t.requires_grad for t in (W, U0, k_out_t, decay, S)):
        kept, news = [], []
        for n in range(N):
            X = decay[n] * S
            kept.append(X if keep_decayed else S)
            news.append(torch.baddbmm(U0[n], W[n], kept[-1], alpha=-1))
            S = torch.baddbmm(X, k_out_t[n], news[-1])
        return torch.cat(kept), torch.cat(news), S
    kept, news = S.new_empty(N, *S.shape), U0.new_empty(N, *U0.shape[1:-1], S.shape[-1])
    for n in range(N):
        X = torch.mul(decay[n], S, out=kept[n]) if keep_decayed else decay[n] * kept[n].copy_(S)
        torch.baddbmm(U0[n], W[n], kept[n], alpha=-1, out=news[n])
        S = torch.baddbmm(X, k_out_t[n], news[n])
    return kept.flatten(0, 1), news.flatten(0, 1), S


# ---------------------------------------------------------------------------- layer
class KDALayer(nn.Module):
    """The KDA token mixer of Kimi Linear / K3 (kda.md §3). x [B,T,D] (already RMS-normed) -> y [B,T,D].

    q, k, v = SiLU(causal depthwise short conv(proj x)); q, k L2-normalised per head;
    g = kda_gate(f_b(f_a x)) (low-rank decay gate); beta = sigmoid(b_proj x);
    o = KDA(q, k, v, g, beta); y = o_proj(RMSNorm_head(o) * sigmoid(g_proj x)).
    The output gate's g_proj is full rank in K3; Kimi Linear factors it as g_b_proj(g_a_proj x) of rank
    `kda_output_gate_rank` (128), like the decay gate f_b(f_a x).
    """

    def __init__(self, config: K3Config, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        D, H, K = config.hidden_size, config.kda_heads, config.kda_head_dim
        self.config = config
        self.num_heads, self.head_k_dim, self.head_v_dim = H, K, K  # K = V in Kimi Linear and K3
        self.conv_kernel = W = config.kda_conv_kernel
        self.lower_bound = config.kda_gate_lower_bound
        self.chunk_size = config.kda_chunk_size
        self.eps = config.rms_norm_eps
        self.q_proj = nn.Linear(D, H * K, bias=False, **kw)
        self.k_proj = nn.Linear(D, H * K, bias=False, **kw)
        self.v_proj = nn.Linear(D, H * K, bias=False, **kw)
        # Depthwise causal convs: weight [C, 1, W], w[W-1] multiplies the current token.
        self.q_conv = nn.Conv1d(H * K, H * K, W, groups=H * K, bias=False, **kw)
        self.k_conv = nn.Conv1d(H * K, H * K, W, groups=H * K, bias=False, **kw)
        self.v_conv = nn.Conv1d(H * K, H * K, W, groups=H * K, bias=False, **kw)
        self.f_a_proj = nn.Linear(D, config.kda_gate_rank, bias=False, **kw)   # decay gate, low rank
        self.f_b_proj = nn.Linear(config.kda_gate_rank, H * K, bias=False, **kw)
        self.b_proj = nn.Linear(D, H, bias=False, **kw)                        # beta
        self.A_log = nn.Parameter(torch.empty(H, **kw))
        self.dt_bias = nn.Parameter(torch.empty(H * K, **kw))
        low_rank = config.kda_output_gate_rank is not None  # output gate: full rank (K3) or low rank (Kimi Linear)
        self.g_proj = None if low_rank else nn.Linear(D, H * K, bias=False, **kw)
        self.g_a_proj = nn.Linear(D, config.kda_output_gate_rank, bias=False, **kw) if low_rank else None
        self.g_b_proj = nn.Linear(config.kda_output_gate_rank, H * K, bias=False, **kw) if low_rank else None
        self.o_norm_weight = nn.Parameter(torch.ones(K, **kw))
        self.o_proj = nn.Linear(H * K, D, bias=False, **kw)
        self.reset_gate_parameters()
        # Inference caches (tiny_k3/fused.py): the projections of x as one matmul, the three conv weights as one.
        # (K3's full-rank output gate g_proj reads x too: it joins that matmul.)
        self._in_proj = FusedLinears(self, ("q_proj", "k_proj", "v_proj"), ("f_a_proj",), ("b_proj",),
                                     *([("g_proj",)] if self.g_proj is not None else []))
        self._conv_weight = CachedCat(self, ("q_conv", "k_conv", "v_conv"))

    @torch.no_grad()
    def reset_gate_parameters(self) -> None:
        """fla's init of the decay gate (kda.md §3); the projections are TinyK3's `_init_weights`."""
        # A_log = log U(1, 16); fla starts it at 0 when the lower-bound gate is used.
        if self.lower_bound is None:
            self.A_log.copy_(torch.rand_like(self.A_log, dtype=torch.float32).mul(15).add(1).log())
        else:
            self.A_log.zero_()
        # dt log-uniform in [1e-3, 1e-1] (clamped >= 1e-4); dt_bias = softplus^-1(dt) = dt + log(1 - e^-dt).
        lo, hi = math.log(1e-3), math.log(1e-1)
        dt = (torch.rand_like(self.dt_bias, dtype=torch.float32) * (hi - lo) + lo).exp().clamp_min(1e-4)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-sigmoid output gate [B, T, H*V]: g_proj x (K3, full rank) or g_b_proj(g_a_proj x) (Kimi Linear)."""
        return self.g_proj(x) if self.g_proj is not None else self.g_b_proj(self.g_a_proj(x))

    def _short_conv(self, x: torch.Tensor, cache: KDAState | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal depthwise conv over time. x [B,T,C] pre-conv q|k|v -> (conv out [B,T,C], new tail [B,W-1,C]).

        The conv sees the last W-1 inputs of earlier calls (zeros at the start), so any split of a
        sequence gives the same result as one pass.
        """
        B, T, C = x.shape
        tail = x.new_zeros(B, self.conv_kernel - 1, C) if cache is None else cache.conv.to(x.dtype)
        full = torch.cat([tail, x], 1)                                        # [B, W-1+T, C]
        convs = self._conv_weight.parts()
        weight = torch.cat(convs, 0) if autograd_needed(convs) else self._conv_weight()   # [C, 1, W]
        if T == 1:  # decode: one output per channel, sum_w full[w] weight[w]: cheaper than conv1d's set-up
            out = (full * weight[:, 0].T).sum(1, keepdim=True)
        else:
            out = F.conv1d(full.transpose(1, 2), weight, groups=C).transpose(1, 2)  # no padding: exactly T outputs
        return out, full[:, full.shape[1] - (self.conv_kernel - 1):].clone()  # clone: don't pin all of `full`

    def forward(self, x: torch.Tensor, cache: KDAState | None = None, recorder: Recorder = NO_RECORDER,
                layer: int = 0, hooks=None) -> tuple[torch.Tensor, KDAState]:
        """x [B,T,D] -> (y [B,T,D], the KDAState after these T tokens). cache: the state before them, or None.

        `hooks` (tiny_k3.hooks.Hooks) may zero heads of `cache` first and scale g; None: as trained."""
        if x.dim() != 3 or x.shape[-1] != self.config.hidden_size:
            raise ValueError(f"KDALayer: x must have shape [B, T, D] with D = hidden_size = "
                             f"{self.config.hidden_size}, got {list(x.shape)}.")
        B, T, D = x.shape
        H, K, V = self.num_heads, self.head_k_dim, self.head_v_dim
        C = 2 * H * K + H * V
        if cache is not None and (tuple(cache.state.shape) != (B, H, K, V)
                                  or tuple(cache.conv.shape) != (B, self.conv_kernel - 1, C)):
            raise ValueError(f"KDA cache must hold state [B, H, K, V] = {[B, H, K, V]} and conv "
                             f"[B, W-1, C] = {[B, self.conv_kernel - 1, C]}, got {list(cache.state.shape)} "
                             f"and {list(cache.conv.shape)}.")
        if hooks is not None:
            cache = hooks.reset_state(layer, cache, H, K)
        fp = _compute_dtype(x)  # q,k,v after the conv, gates, state, output norm: float32 (float64 for float64 x)

        projected, gate_low_rank, beta_logit, *out_gate = self._in_proj(x)   # q|k|v, f_a x, b x (, g x): one matmul
        mixed, conv_tail = self._short_conv(projected, cache)
        qk, v = F.silu(mixed).to(fp).split([2 * H * K, H * V], -1)
        # L2 norm per head, x / sqrt(sum x^2 + 1e-6) (fla's use_qk_l2norm_in_kernel), in float32: q and k
        # side by side as 2H heads, one pass for both.
        qk = qk.reshape(B, T, 2 * H, K)
        qk = qk * torch.rsqrt(qk.pow(2).sum(-1, keepdim=True) + 1e-6)
        q, k = qk[:, :, :H], qk[:, :, H:]
        v = v.reshape(B, T, H, V)
        g = kda_gate(self.f_b_proj(gate_low_rank).view(B, T, H, K), self.A_log, self.dt_bias, self.lower_bound)
        if hooks is not None:
            g = hooks.scale_decay(layer, g)
        beta = torch.sigmoid(beta_logit.to(fp))

        prev = None if cache is None else cache.state
        kda = kda_step if T == 1 else kda_chunked  # fla: fused_recurrent for decode, chunk for prefill
        extra = {} if T == 1 else {"chunk_size": self.chunk_size}
        o, state = kda(q, k, v, g, beta, initial_state=prev, output_final_state=True, **extra)
        if recorder is not NO_RECORDER:  # (the default ignores everything: skip even the detach views)
            recorder.record("kda", layer, prev_state=None if prev is None else prev.detach(),
                            state=state.detach(), g=g.detach(), beta=beta.detach(),
                            q=q.detach(), k=k.detach(), v=v.detach())

        # Gated RMSNorm per head over V (fla FusedRMSNormGated, computed in float32).
        o = o.to(fp)
        gate = (out_gate[0] if out_gate else self.output_gate(x)).view(B, T, H, V).to(fp)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.o_norm_weight.to(fp)
        o = o * torch.sigmoid(gate)
        y = self.o_proj(o.to(x.dtype).reshape(B, T, H * V))
        return y, KDAState(state=state.to(fp), conv=conv_tail)
