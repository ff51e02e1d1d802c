"""Kimi Delta Attention (KDA): the gated delta rule with a per-key-channel decay.

Per head the memory is a matrix S [K, V] (key-major). Each token decays the rows of S by
alpha_t = exp(g_t) (one factor per key channel), then writes v_t under key k_t with the delta
rule (kda.md §1):

    S' = Diag(exp g_t) S_{t-1};   S_t = S' + beta_t k_t (v_t - S'^T k_t)^T;   o_t = S_t^T (scale q_t)

`kda_recurrent` is that definition, token by token, and `kda_step` the same for one decode token.
`kda_chunked` (tiny_k3/kda_chunk.py) computes the same thing a chunk at a time with the WY/UT form
(kda.md §2). `KDALayer` wraps it with the projections, short convolutions, gates and output norm of
Kimi Linear / K3 (kda.md §3).

Layout (fla, time-major): q, k, g [B,T,H,K]; v [B,T,H,V]; beta [B,T,H]; state [B,H,K,V].
The state is accumulated in float32 (float64 when the inputs are float64).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import compiled, conv_native
from .cache import KDAState
from .config import K3Config
from .fused import CachedCat, CachedWeights, FusedLinears, autograd_needed, constant
from .kda_chunk import check_inputs, compute_dtype, kda_chunked, kda_chunked_compiled
from .norm import rms_norm
from .probe import NO_RECORDER, Recorder, detached
from .shortconv import causal_conv

__all__ = ["KDALayer", "kda_chunked", "kda_gate", "kda_recurrent", "kda_stateless", "kda_step"]

def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in dtype; the same tensor when it already is (a decode step makes ~10 such casts per layer, and even a
    no-op `.to` costs a dispatch)."""
    return t if t.dtype == dtype else t.to(dtype)


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
    dtype = compute_dtype(g_raw, A_log, dt_bias)
    x = g_raw.to(dtype) + dt_bias.to(dtype).view(H, K)
    a = A_log.to(dtype).exp().view(H, 1)
    if lower_bound is None:
        return -a * F.softplus(x)  # torch's softplus: beta 1, threshold 20, as fla/HF
    return lower_bound * torch.sigmoid(a * x)


_GATE = compiled.op("kda_gate", kda_gate, dynamic=True)   # compiled where TINY_K3_COMPILE asks (tiny_k3/compiled.py)


def heads_after_conv(mixed: torch.Tensor, H: int, K: int, V: int, fp: torch.dtype):
    """The short conv's output q|k|v [B, T, 2HK + HV] -> (q, k [B, T, H, K], v [B, T, H, V]): SiLU, then the L2 norm
    per head of q and k, x / sqrt(sum x^2 + 1e-6) (fla's use_qk_l2norm_in_kernel), in `fp`; q and k side by side as
    2H heads, one pass for both."""
    B, T, _ = mixed.shape
    qk, v = _as(F.silu(mixed), fp).split([2 * H * K, H * V], -1)
    qk = qk.reshape(B, T, 2 * H, K)
    qk = qk * torch.rsqrt(qk.pow(2).sum(-1, keepdim=True).add_(1e-6))     # (a Python number: torch.compile folds it)
    return qk[:, :, :H], qk[:, :, H:], v.reshape(B, T, H, V)


def conv_heads(projected: torch.Tensor, weight: torch.Tensor, H: int, K: int, V: int, fp: torch.dtype):
    """`causal_conv` from no tail, then `heads_after_conv`, as one function for torch.compile: the conv written as
    its W shifted products (y_t = sum_w weight[:, 0, w] x_{t-W+1+w}, tiny_k3/shortconv.py), which inductor fuses
    with the SiLU and the norm, forward and backward (nn.Conv1d's depthwise backward on the CPU is slow).
    projected [B, T, C], weight [C, 1, W] -> (q, k, v, the conv tail [B, W-1, C])."""
    T, W = projected.shape[1], weight.shape[-1]
    full = F.pad(projected, (0, 0, W - 1, 0))                                   # zeros before the first token
    mixed = sum(full[:, w:w + T] * weight[:, 0, w] for w in range(W))
    return (*heads_after_conv(mixed, H, K, V, fp), full[:, T:])


_CONV_HEADS = compiled.op("kda_conv", conv_heads)   # the training path's conv, SiLU and norm, when compiled


# ---------------------------------------------------------------------------- recurrent form
def kda_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
                  scale: float | None = None, initial_state: torch.Tensor | None = None,
                  output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The definition, one token at a time (kda.md §1). Returns (o [B,T,H,V] in q's dtype, state [B,H,K,V] or None).

    q, k, g [B,T,H,K]; v [B,T,H,V]; beta [B,T,H]; initial_state [B,H,K,V] (zeros when None).
    q and k are used as given; scale defaults to K**-0.5.
    """
    B, T, H, K, V = check_inputs("kda_recurrent", q, k, v, g, beta, initial_state)
    scale = K ** -0.5 if scale is None else scale
    out_dtype, dtype = q.dtype, compute_dtype(q, k, v, g, beta, initial_state)
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
    B, T, H, K, V = check_inputs("kda_step", q, k, v, g, beta, initial_state)
    if T != 1:
        raise ValueError(f"kda_step: takes exactly one token (T = 1), got T = {T}; use kda_chunked for more.")
    scale = K ** -0.5 if scale is None else scale
    out_dtype, dtype = q.dtype, compute_dtype(q, k, v, g, beta, initial_state)
    q, k, v, g, beta = (_as(t, dtype) for t in (q, k, v, g, beta))
    k = k.reshape(B * H, 1, K)                                 # [BH, 1, K]
    S = (q.new_zeros(B * H, K, V) if initial_state is None else initial_state.to(dtype).reshape(B * H, K, V))
    S = S * g.reshape(B * H, K, 1).exp()                       # S' = Diag(alpha) S
    delta = torch.baddbmm(v.reshape(B * H, 1, V), k, S, alpha=-1).mul_(beta.reshape(B * H, 1, 1))  # beta (v - S'^T k)
    S = torch.baddbmm(S, k.mT, delta)                          # S' + k delta^T
    o = torch.bmm(q.reshape(B * H, 1, K), S).mul_(constant(scale, S))   # S^T (scale q)  [BH, 1, V]
    return o.view(B, 1, H, V).to(out_dtype), (S.view(B, H, K, V) if output_final_state else None)



def kda_stateless(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, *,
                  scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`kda_recurrent` when the state is forgotten before every token (alpha_t = 0, kda.md §2): each token
    writes into an empty state, S_t = beta_t k_t v_t^T, and reads it back at once, o_t = scale beta_t (q_t.k_t) v_t.
    Returns (o [B,T,H,V] in q's dtype, S_T [B,H,K,V]).

    The layer becomes a local mixer: what it says depends on the short conv's window alone. This is the limit
    of Hooks.forget_before at every token (alpha = e^-30 there), computed in O(T) with no chunk kernel.
    """
    B, T, H, K, V = check_inputs("kda_stateless", q, k, v, k, beta, None)   # (no g: k stands in)
    scale = K ** -0.5 if scale is None else scale
    out_dtype, dtype = q.dtype, compute_dtype(q, k, v, beta)
    q, k, v, beta = (t.to(dtype) for t in (q, k, v, beta))
    read = (q * k).sum(-1).mul(beta).mul(scale)                       # [B,T,H]: scale beta_t q_t.k_t
    o = read.unsqueeze(-1) * v
    if T == 0:
        return o.to(out_dtype), q.new_zeros(B, H, K, V)
    S = (beta[:, -1, :, None, None] * k[:, -1].unsqueeze(-1) * v[:, -1].unsqueeze(-2))  # beta_T k_T v_T^T
    return o.to(out_dtype), S


# ---------------------------------------------------------------------------- layer
def _conv_taps(*weights: torch.Tensor) -> torch.Tensor:
    """Depthwise conv weights [C_i, 1, W] -> one time-major tap matrix [W, sum C_i] (decode's weighted sum)."""
    return torch.cat(weights, 0)[:, 0].T.contiguous()


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
        self._conv_taps = CachedWeights(self, ("q_conv", "k_conv", "v_conv"), _conv_taps)   # [W, C], for decode
        self._gate_weights = CachedWeights(self, ("f_b_proj.weight", "A_log", "dt_bias"), self._fold_gate, attr=None)

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

    def decay_gate(self, gate_low_rank: torch.Tensor) -> torch.Tensor:
        """Log decay g [..., H*K] from f_a x [..., rank]: kda_gate(f_b(f_a x)) (kda.md §3).

        Without autograd, K3's bounded gate lb * sigmoid(a (f_b z + dt_bias)), a = exp(A_log) per head, is one
        product with a bias: the weights a ⊙ W_b and a ⊙ dt_bias are cached (`_gate_weights`); the same value
        to float rounding (tests/test_decode_paths.py)."""
        if self.lower_bound is None or (torch.is_grad_enabled()   # (the parts are looked up only with autograd on)
                                        and autograd_needed((gate_low_rank, *self._gate_weights.parts()))):
            H, K = self.num_heads, self.head_k_dim
            raw = self.f_b_proj(gate_low_rank)
            return _GATE(raw.view(-1, 1, H, K), self.A_log, self.dt_bias, self.lower_bound).view(raw.shape)
        weight, bias = self._gate_weights()
        if gate_low_rank.dtype != weight.dtype:   # (float32, or float64 with float64 inputs: as kda_gate)
            dtype = compute_dtype(gate_low_rank, weight)
            gate_low_rank, weight, bias = gate_low_rank.to(dtype), weight.to(dtype), bias.to(dtype)
        return torch.sigmoid(F.linear(gate_low_rank, weight, bias)).mul_(constant(self.lower_bound, weight))

    def _fold_gate(self, f_b: torch.Tensor, A_log: torch.Tensor,
                   dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(a ⊙ W_b [H*K, rank], a ⊙ dt_bias [H*K]) with a = exp(A_log) repeated over each head's K channels."""
        dtype = compute_dtype(f_b, A_log, dt_bias)                                 # float32, or float64
        a = A_log.to(dtype).exp().repeat_interleave(self.head_k_dim)               # [H*K]: each head's a, per channel
        return f_b.to(dtype) * a[:, None], dt_bias.to(dtype) * a

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-sigmoid output gate [B, T, H*V]: g_proj x (K3, full rank) or g_b_proj(g_a_proj x) (Kimi Linear)."""
        return self.g_proj(x) if self.g_proj is not None else self.g_b_proj(self.g_a_proj(x))

    def _short_conv(self, x: torch.Tensor, cache: KDAState | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal depthwise conv over time (tiny_k3/shortconv.py). x [B,T,C] pre-conv q|k|v -> (conv out [B,T,C],
        new tail [B,W-1,C]); the tail carries the last W-1 inputs, so any split of a sequence gives one pass's result."""
        convs = self._conv_weight.parts()
        grad = autograd_needed(convs)
        weight = torch.cat(convs, 0) if grad else self._conv_weight()          # [C, 1, W]
        taps = None if grad or x.shape[1] != 1 else self._conv_taps()          # [W, C], decode's cached form
        return causal_conv(x, weight, None if cache is None else cache.conv, taps)

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
        fp = compute_dtype(x)  # q,k,v after the conv, gates, state, output norm: float32 (float64 for float64 x)

        projected, gate_low_rank, beta_logit, *out_gate = self._in_proj(x)   # q|k|v, f_a x, b x (, g x): one matmul
        if compiled.enabled() and cache is None and autograd_needed([projected, *self._conv_weight.parts()]):
            conv_weight = torch.cat(self._conv_weight.parts(), 0)             # training: one fused op (below),
            problem = conv_native.available(projected, conv_weight, H, K, fp)   # in C where it can run
            if problem is None:
                q, k, v, conv_tail = conv_native.conv_heads_native(projected, conv_weight, H, K, V)
            else:
                compiled.fall_back("KDA's C conv (inductor's instead)", problem)
                q, k, v, conv_tail = _CONV_HEADS(projected, conv_weight, H, K, V, fp)
        else:
            mixed, conv_tail = self._short_conv(projected, cache)
            q, k, v = heads_after_conv(mixed, H, K, V, fp)
        g = self.decay_gate(gate_low_rank).view(B, T, H, K)
        if hooks is not None:
            g = hooks.scale_decay(layer, g)
        beta = torch.sigmoid(_as(beta_logit, fp))

        prev = None if cache is None else cache.state
        if hooks is not None and hooks.forgets_every_token():   # (a training recipe: Stage.memoryless)
            o, state = kda_stateless(q, k, v, beta)
        else:
            # fla: fused_recurrent for decode, chunk for prefill (compiled with autograd where TINY_K3_COMPILE asks)
            kda = kda_step if T == 1 else kda_chunked_compiled if compiled.enabled() else kda_chunked
            extra = {} if T == 1 else {"chunk_size": self.chunk_size}
            o, state = kda(q, k, v, g, beta, initial_state=prev, output_final_state=True, **extra)
        if recorder is not NO_RECORDER:  # (the default ignores everything: skip even the detach views)
            recorder.record("kda", layer, prev_state=None if prev is None else detached(prev),
                            state=detached(state), g=detached(g), beta=detached(beta),
                            q=detached(q), k=detached(k), v=detached(v), conv_in=detached(projected))

        # Gated RMSNorm per head over V (fla FusedRMSNormGated, computed in float32).
        gate = _as((out_gate[0] if out_gate else self.output_gate(x)).view(B, T, H, V), fp)
        o = rms_norm(_as(o, fp), _as(self.o_norm_weight, fp), self.eps) * torch.sigmoid(gate)
        y = self.o_proj(_as(o, x.dtype).reshape(B, T, H * V))
        return y, KDAState(state=_as(state, fp), conv=conv_tail)
