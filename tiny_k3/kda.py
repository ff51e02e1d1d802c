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


# ---------------------------------------------------------------------------- chunked form
_SUB_CHUNK = 16  # sub-chunk length for chunks whose decay is too strong to factor at once (fla also uses 16)


def _max_safe_spread(dtype: torch.dtype) -> float:
    """The widest range of Γ (one key channel, one chunk) that the factored products can take.

    Factored, each factor is exp(±(Γ - ref)) with ref mid-range, so at most exp(spread / 2), about
    exp(40) in float32. The kept (i <= r) products are true values exp(Γ_r - Γ_i) <= 1.
    """
    return math.log(torch.finfo(dtype).max) - 8.0


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


def _unit_lower_inverse(A: torch.Tensor, block: int = 16) -> torch.Tensor:
    """(I + A)^-1 for strictly lower-triangular A [M, C, C] (the UT transform's inverse, kda.md §2).

    Block forward substitution: all 16x16 diagonal blocks D_j in one batched triangular solve, then
    row block j is X[j, :j] = -D_j^-1 A[j, :j] X[:j, :j] by matmuls. Same result as one C x C solve
    (unitriangular=True reads A's zero diagonal as ones), faster on CPU. Built out of place for autograd.
    """
    M, C, _ = A.shape
    if C <= block or C % block:
        eye = torch.eye(C, dtype=A.dtype, device=A.device).expand(M, C, C)
        return torch.linalg.solve_triangular(A, eye, upper=False, unitriangular=True)
    nb = C // block
    diagonal = A.view(M, nb, block, nb, block).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)  # [M, nb, s, s]
    eye = torch.eye(block, dtype=A.dtype, device=A.device).expand_as(diagonal)
    D = torch.linalg.solve_triangular(diagonal, eye, upper=False, unitriangular=True)
    inverse = D[:, 0]                                          # inverse of the leading a x a block
    for j in range(1, nb):
        a, b = j * block, (j + 1) * block
        row = torch.cat([-D[:, j] @ (A[:, a:b, :a] @ inverse), D[:, j]], -1)   # rows a..b-1, columns 0..b-1
        inverse = torch.cat([F.pad(inverse, (0, block)), row], -2)
    return inverse


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
    """
    B, T, H, K, V = _check_inputs("kda_chunked", q, k, v, g, beta, initial_state)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"kda_chunked: chunk_size must be a positive integer, got {chunk_size!r}.")
    if T == 0:
        return kda_recurrent(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                             output_final_state=output_final_state)
    scale = K ** -0.5 if scale is None else scale
    out_dtype, dtype = q.dtype, _compute_dtype(q, k, v, g, beta, initial_state)
    C, N, BH = chunk_size, -(-T // chunk_size), B * H

    def chunks(x: torch.Tensor) -> torch.Tensor:
        """[B,T,H,...] -> chunk-major [N*B*H, C, ...] (one copy, zero-padded tail): chunk n is contiguous."""
        x = x.unsqueeze(-1)                                     # beta gets a last dim too
        if N * C > T:
            x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, N * C - T))
        x = x.reshape(B, N, C, H, -1).permute(1, 0, 3, 2, 4)
        return x.to(dtype).reshape(N * BH, C, -1)

    q, k, v, g, beta = chunks(q), chunks(k), chunks(v), chunks(g), chunks(beta)   # beta [M, C, 1]
    G = g.cumsum(-2)                                          # Γ_r = g_1 + ... + g_r, per chunk
    k_beta = k * beta
    A, P = _chunk_products((k_beta, q), k, G)
    A = A.tril(-1)                                            # A[r,i] = β_r Σ_d k_rd k_id e^(Γ_rd - Γ_id), i < r
    P = P.tril()                                              # P[r,i] = Σ_d q_rd k_id e^(Γ_rd - Γ_id), i <= r
    T_inv = _unit_lower_inverse(A)                            # UT transform: (I + A)^-1
    eG = G.exp()
    W = T_inv @ (k_beta * eG)                                 # W = (I+A)^-1 Diag(β) (K ⊙ e^Γ)
    U0 = T_inv @ (v * beta)                                   # U0 = (I+A)^-1 Diag(β) V
    q_in = q * eG                                             # queries read S0 decayed to their position
    G_end = G[:, -1:]                                         # Γ_C: the decay over the whole chunk
    k_out = (k * (G_end - G).exp()).transpose(-1, -2)         # [K, C]: writes decayed to the chunk end
    decay = G_end.transpose(-1, -2).exp()                     # [K, 1]: rows of S0 decayed to the chunk end

    # The only sequential part: carry S across chunks (2 matmuls per chunk), keeping S0 and U of each.
    W, U0, k_out, decay = (t.view(N, BH, *t.shape[1:]) for t in (W, U0, k_out, decay))
    S = q.new_zeros(BH, K, V) if initial_state is None else initial_state.to(dtype).reshape(BH, K, V)
    starts, news = [], []
    for n in range(N):
        U = torch.baddbmm(U0[n], W[n], S, alpha=-1)           # U = U0 - W S0: v minus what S0 predicts
        starts.append(S)
        news.append(U)
        S = torch.baddbmm(decay[n] * S, k_out[n], U)          # S_C = Diag(e^Γ_C) S0 + (K ⊙ e^(Γ_C-Γ))^T U
    S0, U = torch.stack(starts).view(-1, K, V), torch.stack(news).view(-1, C, V)
    o = torch.baddbmm(q_in @ S0, P, U, beta=scale, alpha=scale)  # O = scale ((Q ⊙ e^Γ) S0 + P U)
    o = o.view(N, B, H, C, V).permute(1, 0, 3, 2, 4).reshape(B, N * C, H, V)[:, :T]
    return o.to(out_dtype), (S.view(B, H, K, V) if output_final_state else None)


# ---------------------------------------------------------------------------- layer
class KDALayer(nn.Module):
    """The KDA token mixer of Kimi Linear / K3 (kda.md §3). x [B,T,D] (already RMS-normed) -> y [B,T,D].

    q, k, v = SiLU(causal depthwise short conv(proj x)); q, k L2-normalised per head;
    g = kda_gate(f_b(f_a x)) (low-rank decay gate); beta = sigmoid(b_proj x);
    o = KDA(q, k, v, g, beta); y = o_proj(RMSNorm_head(o) * sigmoid(g_proj x)).
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
        self.g_proj = nn.Linear(D, H * K, bias=False, **kw)                    # output gate, full rank (K3)
        self.o_norm_weight = nn.Parameter(torch.empty(K, **kw))
        self.o_proj = nn.Linear(H * K, D, bias=False, **kw)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """fla's init (kda.md §3); a no-op on the meta device, which has no data."""
        if self.A_log.is_meta:
            return
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, 0.0, self.config.init_std)
            # A_log = log U(1, 16); fla starts it at 0 when the lower-bound gate is used.
            if self.lower_bound is None:
                self.A_log.copy_(torch.rand_like(self.A_log, dtype=torch.float32).mul(15).add(1).log())
            else:
                self.A_log.zero_()
            # dt log-uniform in [1e-3, 1e-1] (clamped >= 1e-4); dt_bias = softplus^-1(dt) = dt + log(1 - e^-dt).
            lo, hi = math.log(1e-3), math.log(1e-1)
            dt = (torch.rand_like(self.dt_bias, dtype=torch.float32) * (hi - lo) + lo).exp().clamp_min(1e-4)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            self.o_norm_weight.fill_(1.0)

    def _short_conv(self, x: torch.Tensor, cache: KDAState | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal depthwise conv over time. x [B,T,C] pre-conv q|k|v -> (conv out [B,T,C], new tail [B,W-1,C]).

        The conv sees the last W-1 inputs of earlier calls (zeros at the start), so any split of a
        sequence gives the same result as one pass.
        """
        B, T, C = x.shape
        tail = x.new_zeros(B, self.conv_kernel - 1, C) if cache is None else cache.conv.to(x.dtype)
        full = torch.cat([tail, x], 1)                                        # [B, W-1+T, C]
        weight = torch.cat([self.q_conv.weight, self.k_conv.weight, self.v_conv.weight], 0)  # [C, 1, W]
        out = F.conv1d(full.transpose(1, 2), weight, groups=C).transpose(1, 2)  # no padding: exactly T outputs
        return out, full[:, full.shape[1] - (self.conv_kernel - 1):].clone()  # clone: don't pin all of `full`

    def forward(self, x: torch.Tensor, cache: KDAState | None = None, recorder=None,
                layer: int = 0) -> tuple[torch.Tensor, KDAState]:
        """x [B,T,D] -> (y [B,T,D], the KDAState after these T tokens). cache: the state before them, or None."""
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
        fp = _compute_dtype(x)  # q,k,v after the conv, gates, state, output norm: float32 (float64 for float64 x)

        projected = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], -1)
        mixed, conv_tail = self._short_conv(projected, cache)
        q, k, v = F.silu(mixed).to(fp).split([H * K, H * K, H * V], -1)
        # L2 norm per head, x / sqrt(sum x^2 + 1e-6) (fla's use_qk_l2norm_in_kernel), in float32.
        q, k = (t.reshape(B, T, H, K) for t in (q, k))
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        v = v.reshape(B, T, H, V)
        g = kda_gate(self.f_b_proj(self.f_a_proj(x)).view(B, T, H, K), self.A_log, self.dt_bias, self.lower_bound)
        beta = torch.sigmoid(self.b_proj(x).to(fp))

        prev = None if cache is None else cache.state
        kda = kda_recurrent if T == 1 else kda_chunked  # fla: fused_recurrent for decode, chunk for prefill
        extra = {} if T == 1 else {"chunk_size": self.chunk_size}
        o, state = kda(q, k, v, g, beta, initial_state=prev, output_final_state=True, **extra)
        if recorder is not None:
            recorder.record("kda", layer, prev_state=None if prev is None else prev.detach(),
                            state=state.detach(), g=g.detach(), beta=beta.detach())

        # Gated RMSNorm per head over V (fla FusedRMSNormGated, computed in float32).
        o = o.to(fp)
        gate = self.g_proj(x).view(B, T, H, V).to(fp)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.o_norm_weight.to(fp)
        o = o * torch.sigmoid(gate)
        y = self.o_proj(o.to(x.dtype).reshape(B, T, H * V))
        return y, KDAState(state=state.to(fp), conv=conv_tail)
