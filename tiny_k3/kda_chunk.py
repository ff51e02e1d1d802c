"""The chunked forms of KDA: `kda_recurrent`'s result a chunk of tokens at a time (WY/UT form, kda.md §2).

Inside a chunk everything is a few batched matmuls and a triangular inverse; only the state is
carried from chunk to chunk. `kda_chunked` picks among three implementations of the same equations
(see its docstring); each is tested equal to `kda_recurrent` in float64 (tests/test_kda.py).

Layout (fla, time-major): q, k, g [B,T,H,K]; v [B,T,H,V]; beta [B,T,H]; state [B,H,K,V].
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from . import compiled, native
from .fused import autograd_needed, scratch_buffer


# ---------------------------------------------------------------------------- boundary helpers (every KDA op)
def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 when any input is float64, else float32 (bf16/fp16 inputs are upcast)."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def check_inputs(fn: str, q, k, v, g, beta, initial_state) -> tuple[int, int, int, int, int]:
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


# ---------------------------------------------------------------------------- chunked form
_SUB_CHUNK = 16  # sub-chunk length for chunks whose decay is too strong to factor at once (fla also uses 16)


def _max_safe_spread(dtype: torch.dtype) -> float:
    """The widest range of Γ (one key channel, one chunk) that the factored products can take.

    Factored around a reference, each factor lies between e^-spread and e^spread (the kept i <= r products
    are true values exp(Γ_r - Γ_i) <= 1), and two meet in some products: a backward multiplies a factor by
    its partner once more, and the CPU form's carried state and decayed writes hold a factor times a decay.
    So the range is half the dtype's log-range less a margin for sums (exp(8) ≈ 3000): about 40 in float32,
    350 in float64. Then nothing overflows to inf (the full range gave inf gradients, NaN after clipping,
    for decays of about -1 per token over 64-token chunks), and nothing sinks below the normal floats either:
    products that read subnormals run ~5-10x slower on x86 (bench_kda's g = -5 row: 270 ms at a spread of 75,
    60 ms at 40, where chunks of 8 keep every value normal).
    """
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
    Everything but U, O and S_C is computed for many chunks at once; the loop over chunks carries
    only the state. T need not be a multiple of the chunk: the tail is padded with k = v = beta = 0
    and g = 0 (no write, no decay), and the padding is dropped.

    Three implementations of these equations, all equal to `kda_recurrent`; any chunk length gives the
    same result. `_chunked_factored` when every decay range can be factored around its chunk's end (the
    usual case), at chunk_size or, where the decay is too strong for that, at chunk_size / 2, / 4, ...
    down to 16; `_chunked_cpu`, the same factored equations without autograd on CPU, segment by segment
    (chunks of 32 there, halved per segment down to 4 where the decay needs it: see `_CPU_CHUNK`); else
    `_chunked_general` at chunk_size (sub-chunks,
    and pair-by-pair products where even those are too wide).
    """
    B, T, H, K, V = check_inputs("kda_chunked", q, k, v, g, beta, initial_state)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"kda_chunked: chunk_size must be a positive integer, got {chunk_size!r}.")
    scale = K ** -0.5 if scale is None else scale
    out_dtype, dtype = q.dtype, compute_dtype(q, k, v, g, beta, initial_state)
    S = (q.new_zeros(B * H, K, V, dtype=dtype) if initial_state is None
         else initial_state.to(dtype).reshape(B * H, K, V))
    if T == 0:
        return q.new_zeros(B, 0, H, V), (S.view(B, H, K, V) if output_final_state else None)
    # (Not while torch.compile traces this function: the CPU form's `out=` writes into reused scratch views are
    # eager's answer to dispatch costs and page faults; inductor plans its own buffers and cannot lower them.)
    if (q.device.type == "cpu" and not torch.compiler.is_compiling()
            and not autograd_needed([t for t in (q, k, v, g, beta, initial_state) if t is not None])):
        fast = _chunked_cpu(q, k, v, g, beta, S, scale, min(chunk_size, _CPU_CHUNK))
        if fast is not None:
            o, S = fast
            return o.to(out_dtype), (S.view(B, H, K, V) if output_final_state else None)
        chunks = _Chunker(B, T, H, chunk_size, dtype)   # too strong a decay to factor even at 4 tokens
        o, S = _chunked_general(chunks, q, k, v, beta, _chunk_cumsum(chunks(g)), S, scale)
    else:
        chunks, o, S = _chunked_adaptive(q, k, v, g, beta, S, scale, chunk_size)
    o = o.view(chunks.N, B, H, chunks.C, V).permute(1, 0, 3, 2, 4).reshape(B, -1, H, V)[:, :T]
    return o.to(out_dtype), (S.view(B, H, K, V) if output_final_state else None)


def _chunked_adaptive(q, k, v, g, beta, S, scale, chunk_size: int):
    """The factored form at chunk_size, or where the decay over a chunk is too wide to factor at chunk_size / 2,
    / 4, ... down to the sub-chunk length (fewer tokens, a narrower range; about twice as fast as the general
    form at the longer chunk), else the general form at chunk_size. -> (the _Chunker used, O [M, C, V], S)."""
    B, T, H, _ = q.shape
    C, general = chunk_size, None
    while True:
        chunks = _Chunker(B, T, H, C, S.dtype)
        G = _chunk_cumsum(chunks(g))                           # [M, C, K]: Γ_r = g_1 + ... + g_r, per chunk
        to_end = G[:, -1:] - G                                 # Γ_C - Γ_r (<= 0 when g <= 0)
        lo, hi = torch.aminmax(to_end.detach())                # one range for all chunks: a sufficient check
        if float(hi - lo) <= _max_safe_spread(S.dtype):
            return (chunks, *_chunked_factored(chunks, q, k, v, beta, G, to_end, S, scale))
        general = (chunks, G) if general is None else general  # the general form runs at the chunk asked for
        if C <= _SUB_CHUNK or C % 2:
            chunks, G = general
            return (chunks, *_chunked_general(chunks, q, k, v, beta, G, S, scale))
        C //= 2


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


def _carry_state(N: int, W, U0, k_out_t, decay, S, keep_decayed: bool, buffers=None):
    """The only sequential part: carry the state across the N chunks, 2 matmuls per chunk.

    Per chunk n: X = decay S;  U = U0 - W Y;  S <- X + k_out_t U, with Y = X (`keep_decayed`, the factored
    form) or Y = S (the general form). W, U0 [M, C, .], k_out_t [M, K, C], decay [M, K, 1], chunk-major
    (M = N*BH); S [BH, K, V]. Returns (Y per chunk [M, K, V], U [M, C, V], the state after the last chunk).
    Without autograd the per-chunk results go straight into their buffers (`out=`; `buffers` may give
    them, [N, BH, K, V] and [N, BH, C, V]); with it, into lists.
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
    kept, news = buffers or (S.new_empty(N, *S.shape), U0.new_empty(N, *U0.shape[1:-1], S.shape[-1]))
    for W_n, U0_n, k_n, decay_n, kept_n, new_n in zip(W, U0, k_out_t, decay, kept, news):
        X = torch.mul(decay_n, S, out=kept_n) if keep_decayed else decay_n * kept_n.copy_(S)
        torch.baddbmm(U0_n, W_n, kept_n, alpha=-1, out=new_n)
        S = torch.baddbmm(X, k_n, new_n)
    return kept.flatten(0, 1), news.flatten(0, 1), S


# ---------------------------------------------------------------------------- the no-autograd CPU form
# On CPU these small batched products and element-wise passes are memory-bound, not FLOP-bound: an
# element-wise op on a 256 KB tensor runs ~2.5x the rate of one on 4 MB (L2 vs L3), a batched matmul
# with a transposed operand first copies it (~3x a row-major one), and the in-chunk products grow with C
# while the state carry does not. Hence segments sized for the caches, row-major operands only, and C = 32.
# And fresh memory is dear: the first write to each 4 KB page faults (~3 us on a VM, ~1 us bare metal), and
# glibc hands the freed megabytes back to the kernel, so per-call temporaries fault again on every call
# (measured at T = 4096: ~3,700 faults a call, ~10 ms of a 35 ms call, before this form kept them). Every
# intermediate therefore lives in a per-thread scratch (`fused.scratch_buffer`, about 6 MB here), reused from
# segment to segment and from call to call; only the output is new memory.
_CPU_CHUNK = 32                 # the longest chunk of `_chunked_cpu` (bench_kda: 32 beats 16 and 64)
_CPU_MIN_CHUNK = 4              # its shortest: at K3's gate bound (g >= -5) chunks of 8 always factor
_SEGMENT_BYTES = 512 * 1024     # one [tokens, H, K] operand of a segment (256 KB-1 MB swept at 1 and 2 threads)


@functools.lru_cache(maxsize=16)
def _chunk_constants(C: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(strictly upper ones [C, C]: Σ of what follows, identity [C, C]), made once per chunk length. Read only."""
    with torch.inference_mode(False):
        return (torch.ones(C, C, dtype=dtype, device=device).triu_(1), torch.eye(C, dtype=dtype, device=device))


def _pad_time(x: torch.Tensor, length: int) -> torch.Tensor:
    """x [B, T, ...] zero-padded along time to `length` (no copy when already that long)."""
    pad = length - x.shape[1]
    return F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad)) if pad else x


def _chunked_cpu(q, k, v, g, beta, S, scale, C) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`_chunked_factored`'s equations without autograd, a segment of chunks at a time -> (O [B,T,H,V], S).

    q, k, g [B,T,H,K]; v [B,T,H,V]; beta [B,T,H]; S [B*H, K, V] in the compute dtype (never written: it may
    be the caller's initial state); C the longest chunk. The sequence is cut into segments of about
    `_SEGMENT_BYTES` per operand, and `_cpu_segment` carries the state through each in turn, at C or, where
    that segment's decay is too strong to factor at C, at C/2, C/4 ... down to `_CPU_MIN_CHUNK`. Returns None
    when even that is too long for some segment (the caller then runs the general form).
    """
    B, T, H, K = q.shape
    V, dtype = v.shape[-1], S.dtype
    N = -(-T // C)
    q, k, v, g, beta = (_pad_time(t.to(dtype), N * C) for t in (q, k, v, g, beta))
    beta = beta.unsqueeze(-1)                                   # [B, T, H, 1]
    seg = max(1, _SEGMENT_BYTES // (B * H * max(K, V) * C * torch.finfo(dtype).bits // 8)) * C
    out = q.new_empty(B, N * C, H, V)
    for t0 in range(0, N * C, seg):
        parts = [t[:, t0:t0 + seg] for t in (q, k, v, g, beta, out)]
        chunk = C
        while (S_next := _cpu_segment(*parts, S, scale, chunk)) is None:
            if chunk <= _CPU_MIN_CHUNK or chunk % 2:
                return None
            chunk //= 2
        S = S_next
    return out[:, :T], S


def _cpu_segment(q, k, v, g, beta, out, S, scale: float, C: int) -> torch.Tensor | None:
    """One segment of `_chunked_cpu`: writes O into `out` [B, L, H, V] and returns the state after it, or None
    (nothing written) when the range of Γ_C - Γ over its chunks is too wide to factor at C.

    With to_end = Γ_C - Γ (a product with the strictly upper ones: Σ of g after each token), e = e^to_end:
        k↓ = K ⊙ e,   k↑ = Diag(β) K / e,   q↑ = Q / e,   A = strict_tril(k↑ k↓^T),  P = tril(q↑ k↓^T)
        W = (I+A)^-1 k↑,  U0 = (I+A)^-1 Diag(β) V;  per chunk n: S~_n = Diag(e^Γ_C) S, U = U0 - W S~_n,
        S <- S~_n + k↓^T U,  and after the loop  O = scale (q↑ S~ + P U)  for all chunks at once.
    In the loop S~_{n+1} = D_{n+1} (S~_n + k↓_n^T U_n) (D = Diag(e^Γ_C)) is written straight into the next
    chunk's slot and decayed there: three ops per chunk and no copies. k↓^T [K, C] is the one transposed
    operand: the product that forms it writes it transposed. q↑ and β/e are divisions (one pass each, no
    reciprocal kept).
    """
    B, L, H, K = q.shape
    V, R = v.shape[-1], L // C
    BH, M = B * H, L // C * B * H

    def chunked(x):  # [B, R*C, H, D] -> [R, B, H, C, D] (a strided view)
        return x.unflatten(1, (R, C)).permute(1, 0, 3, 2, 4)

    def scratch(name, *shape):  # (fused.scratch_buffer: kept between calls, per thread)
        return scratch_buffer("kda " + name, shape, q)

    upper, eye = _chunk_constants(C, q.dtype, q.device)
    x = torch.matmul(upper, g.reshape(B * R, C, H * K), out=scratch("to_end", B * R, C, H * K))
    lo, hi = torch.aminmax(x)
    if float(hi - lo) > _max_safe_spread(q.dtype):
        return None
    decay = (x[:, 0] + g.reshape(B * R, C, H * K)[:, 0]).exp_()          # e^Γ_C per chunk, [B*R, H*K]
    decay = decay.view(B, R, H, K).transpose(0, 1).reshape(R, BH, K, 1)
    e = x.exp_().view(B, L, H, K)
    k_down_t = scratch("k_down_t", R, B, H, K, C)
    torch.mul(chunked(k), chunked(e), out=k_down_t.mT)
    q_up = torch.div(chunked(q), chunked(e), out=scratch("q_up", R, B, H, C, K)).view(M, C, K)
    beta_over_e = torch.div(beta, e, out=e)                                  # e is not read again
    k_up = torch.mul(chunked(k), chunked(beta_over_e), out=scratch("k_up", R, B, H, C, K)).view(M, C, K)
    v_beta = torch.mul(chunked(v), chunked(beta), out=scratch("v_beta", R, B, H, C, V)).view(M, C, V)
    k_down_t = k_down_t.view(M, K, C)
    A = torch.bmm(k_up, k_down_t, out=scratch("A", M, C, C)).tril_(-1)
    P = torch.bmm(q_up, k_down_t, out=scratch("P", M, C, C)).tril_()
    T_inv = torch.linalg.solve_triangular(A, eye.expand(M, C, C), upper=False, unitriangular=True,
                                          out=scratch("T_inv", M, C, C))             # (I + A)^-1
    W = torch.bmm(T_inv, k_up, out=scratch("W", M, C, K)).view(R, BH, C, K)
    U = torch.bmm(T_inv, v_beta, out=scratch("U", M, C, V)).view(R, BH, C, V)   # U0, made U in the loop
    k_down_t = k_down_t.view(R, BH, K, C)
    starts = scratch("starts", R, BH, K, V)                                  # S~_n for every chunk
    torch.mul(decay[0], S, out=starts[0])
    # per-chunk views, made once: indexing a tensor 8 times a chunk would cost about what one product does
    Us, Ws, Xs, Ds, Ks = (t.unbind() for t in (U, W, starts, decay, k_down_t))   # Xs[n] = S~_n
    for n in range(R - 1):
        Us[n].baddbmm_(Ws[n], Xs[n], alpha=-1)                                # U_n = U0_n - W_n S~_n
        torch.baddbmm(Xs[n], Ks[n], Us[n], out=Xs[n + 1]).mul_(Ds[n + 1])    # S~_n+1 = D (S~_n + k↓_n^T U_n)
    Us[-1].baddbmm_(Ws[-1], Xs[-1], alpha=-1)
    S = torch.baddbmm(Xs[-1], k_down_t[-1], Us[-1])                         # new memory: returned to the caller
    O = torch.bmm(q_up, starts.view(M, K, V), out=scratch("O", M, C, V)).baddbmm_(P, U.view(M, C, V))
    torch.mul(O.view(R, B, H, C, V), scale, out=chunked(out))
    return S


# ---------------------------------------------------------------------------- the compiled form (tiny_k3/compiled.py)
_COMPILED_CHUNK = 32    # the compiled kernel's chunk: with autograd 32 beat 64 (bench/bench_train.py, small)


def kda_factored(q, k, v, g, beta, S, scale: float, C: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_chunked_factored`'s equations with no branch on the data, for torch.compile -> (O [B,T,H,V], S, spread).

    q, k, g [B,T,H,K]; v [B,T,H,V]; beta [B,T,H]; S [B*H, K, V]; all in the compute dtype. The chunk loop is
    unrolled into the compiled graph (so C sets the graph's size: T / C steps). `spread` is the range of
    Γ_C - Γ over every chunk: the result is exact only while it is below `_max_safe_spread`, which the caller
    checks (a data-dependent branch would split the graph).
    """
    B, T, H, K = q.shape
    N, BH = -(-T // C), B * H

    def chunked(x):   # [B, T, H, D] -> [N, BH, C, D], the tail zero-padded (no write, no decay)
        x = F.pad(x, (0, 0, 0, 0, 0, N * C - T)) if N * C > T else x
        return x.view(B, N, C, H, -1).permute(1, 0, 3, 2, 4).reshape(N, BH, C, -1)

    q, k, v, g, beta = chunked(q), chunked(k), chunked(v), chunked(g), chunked(beta.unsqueeze(-1))
    to_end = torch.ones(C, C, dtype=q.dtype, device=q.device).triu(1) @ g     # Γ_C - Γ_r: Σ of g after r
    spread = (to_end.amax() - to_end.amin()).detach()
    decay = (to_end[:, :, :1] + g[:, :, :1]).exp().mT                          # [N, BH, K, 1] e^Γ_C
    e = to_end.exp()
    k_down_t = (k * e).mT                                                      # k↓^T [N, BH, K, C]
    k_up, q_up = k * (beta / e), q / e                                         # k↑, q↑
    A = (k_up @ k_down_t).tril(-1)
    P = (q_up @ k_down_t).tril()
    eye = torch.eye(C, dtype=q.dtype, device=q.device).expand(N, BH, C, C)
    T_inv = torch.linalg.solve_triangular(A, eye, upper=False, unitriangular=True)   # (I + A)^-1
    W, U0 = T_inv @ k_up, T_inv @ (v * beta)
    starts, news = [], []
    for n in range(N):              # S~ = D S;  U = U0 - W S~;  S <- S~ + k↓^T U
        starts.append(decay[n] * S)
        news.append(torch.baddbmm(U0[n], W[n], starts[-1], alpha=-1))
        S = torch.baddbmm(starts[-1], k_down_t[n], news[-1])
    O = (q_up @ torch.stack(starts) + P @ torch.stack(news)) * scale           # [N, BH, C, V]
    O = O.view(N, B, H, C, -1).permute(1, 0, 3, 2, 4).reshape(B, N * C, H, -1)[:, :T]
    return O, S, spread


_FACTORED = compiled.op("kda_chunked", kda_factored)


def kda_chunked_compiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
                         scale: float | None = None, initial_state: torch.Tensor | None = None,
                         output_final_state: bool = False, chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`kda_chunked`'s result by the fastest path this machine has, while the compiled path is on (tiny_k3/compiled.py).

    With autograd: the compiled `kda_factored` (the chunk loop's small ops, forward and backward, fused). Without
    it on the CPU: the recurrence as a C loop (tiny_k3/kda_native.c via tiny_k3/native.py), which on one core runs
    ahead of every chunked form (bench/bench_kda.py) and needs no compile per prompt length. Elsewhere (the
    switch off, no C compiler, a GPU, a decay too strong to factor): `kda_chunked` itself. Every path computes the
    same equations; the chunk length does not change the result.
    """
    B, T, H, K, V = check_inputs("kda_chunked", q, k, v, g, beta, initial_state)
    kwargs = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state, chunk_size=chunk_size)
    tensors = [t for t in (q, k, v, g, beta, initial_state) if t is not None]
    if not compiled.enabled() or T == 0:
        return kda_chunked(q, k, v, g, beta, **kwargs)
    out_dtype, dtype = q.dtype, compute_dtype(*tensors)
    S = (q.new_zeros(B * H, K, V, dtype=dtype) if initial_state is None
         else initial_state.to(dtype).reshape(B * H, K, V))
    if not autograd_needed(tensors):
        if q.device.type != "cpu":
            return kda_chunked(q, k, v, g, beta, **kwargs)
        if (problem := native.problem(dtype)) is not None:
            compiled.fall_back("kda_chunked (the C recurrence)", problem)
            return kda_chunked(q, k, v, g, beta, **kwargs)
        o, S = native.kda_recurrent_native(q, k, v, g, beta, S.view(B, H, K, V), K ** -0.5 if scale is None else scale)
        return o.to(out_dtype), (S if output_final_state else None)
    o, S, spread = _FACTORED(*(t.to(dtype) for t in (q, k, v, g, beta)), S,
                             K ** -0.5 if scale is None else scale, _COMPILED_CHUNK)
    if float(spread) > _max_safe_spread(dtype):
        return kda_chunked(q, k, v, g, beta, **kwargs)
    return o.to(out_dtype), (S.view(B, H, K, V) if output_final_state else None)
