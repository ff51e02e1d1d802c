"""The retrieval cliff, computed: how many key -> value pairs one fixed K x V state holds, beside softmax attention.

No training and no model: N associations (k_i, v_i) are written into one KDA head's state with the project's
own delta rule (`kda.kda_recurrent`, beta = 1, no decay: S <- S + k (v - S^T k)^T, kda.md §1), then each key
is read back (a second `kda_recurrent` pass with beta = 0 reads S^T k_i and writes nothing). Softmax
attention (`mla.softmax_attention`) reads the same N keys from a cache that keeps all of them, at a
temperature tau: out_i = sum_j softmax_j(k_i . k_j / tau) v_j.

Values come from a codebook of VALUES unit vectors (the "digits"); a read is *exact* when its nearest
codeword (largest cosine) is the one written under that key. Keys are unit vectors, either
- "orthogonal": blocks of K orthonormal rows (a fresh random orthonormal basis per block of K keys), so the
  first K keys are exactly orthogonal and every later one interferes, or
- "random": independent uniform directions (they interfere from the second key on).

The textbook result, as this module measures it in float64:
- the delta rule with orthogonal keys is exact up to N = K (each write lands in its own direction and
  later writes leave it alone) and degrades past it: a K x V state has room for K directions;
- attention stays exact at every N here, because it keeps every key: its cache grows by K + V numbers a pair;
- with the decay gate on (alpha < 1 per step) the state forgets with distance: a pair written d writes ago
  comes back scaled by alpha^d (`decay_row`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .kda import kda_recurrent
from .mla import softmax_attention

KEY_KINDS = ("orthogonal", "random")
VALUES = 10                  # codebook size: ten "digits", as the recall lines' values
TEMPERATURE = 0.02           # attention's tau: sharp enough that a key's own match (cos 1) wins clearly
STORED_BYTES = 4             # bytes per number in the byte columns (float32: the KDA state's dtype in tiny_k3)


@dataclass(frozen=True)
class CapacityPoint:
    """One (method, K, N) cell of the cliff."""

    method: str          # "delta rule" (one K x V state) or "attention" (a cache of all N keys and values)
    keys: str            # "orthogonal" or "random"
    head_dim: int        # K = V
    pairs: int           # N associations written
    cosine: float        # mean cosine between each read and the value written under its key
    exact: float         # share of reads whose nearest codeword is the one written
    memory_bytes: int    # the state (K * V numbers) or the cache (N * (K + V) numbers), STORED_BYTES each


def unit_keys(n: int, dim: int, kind: str, generator: torch.Generator) -> torch.Tensor:
    """[n, dim] float64 unit keys: blocks of dim orthonormal rows ("orthogonal") or independent ("random")."""
    if kind not in KEY_KINDS:
        raise ValueError(f"keys must be one of {', '.join(KEY_KINDS)}, got {kind!r}.")
    if kind == "random":
        keys = torch.randn(n, dim, generator=generator, dtype=torch.float64)
        return keys / keys.norm(dim=-1, keepdim=True)
    blocks = [torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))[0].T
              for _ in range(math.ceil(n / dim))]
    return torch.cat(blocks)[:n]


def _pairs(n: int, dim: int, kind: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(keys [n, K], codebook [VALUES, V], codes [n]) of one experiment, all from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    keys = unit_keys(n, dim, kind, generator)
    codebook = torch.randn(VALUES, dim, generator=generator, dtype=torch.float64)
    codebook = codebook / codebook.norm(dim=-1, keepdim=True)
    codes = torch.randint(VALUES, (n,), generator=generator)
    return keys, codebook, codes


def delta_rule_reads(keys: torch.Tensor, values: torch.Tensor, log_decay: float = 0.0) -> torch.Tensor:
    """Write keys [N, K] -> values [N, V] into one zero state with the delta rule, then read every key back.

    log_decay: g per step and channel (0: no forgetting; log(alpha) < 0: the state decays by alpha per write).
    Returns reads [N, V] = S_N^T k_i, the state after all N writes, through kda_recurrent (beta = 1 to write,
    beta = 0 to read without writing).
    """
    n, dim = keys.shape
    k = keys[None, :, None]                                               # [B=1, T=N, H=1, K]
    g = torch.full_like(k, log_decay)
    ones = torch.ones(1, n, 1, dtype=keys.dtype)
    _, state = kda_recurrent(k, k, values[None, :, None], g, ones, scale=1.0, output_final_state=True)
    reads, _ = kda_recurrent(k, k, torch.zeros_like(values)[None, :, None], torch.zeros_like(k), 0 * ones,
                             scale=1.0, initial_state=state)
    return reads[0, :, 0]


def attention_reads(keys: torch.Tensor, values: torch.Tensor, temperature: float = TEMPERATURE) -> torch.Tensor:
    """Each key [N, K] as a query over all N cached keys and values [N, V]: reads [N, V]."""
    _, out = softmax_attention(keys[None, None], keys[None, None], values[None, None], 1.0 / temperature)
    return out[0, 0]


def score(reads: torch.Tensor, codebook: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(cosine of each read [N] to its written value, how many reads have the written value as nearest codeword)."""
    cos_written = torch.nn.functional.cosine_similarity(reads, codebook[codes], dim=-1)
    nearest = (reads @ codebook.T).argmax(-1)     # codewords are unit vectors: the largest dot is the largest cosine
    return cos_written, int((nearest == codes).sum())


def retrieval_cliff(head_dim: int, pairs: list[int] | tuple[int, ...], keys: str = "orthogonal", seed: int = 0,
                    temperature: float = TEMPERATURE, min_reads: int = 256) -> list[CapacityPoint]:
    """The delta rule and attention at each N in `pairs` (K = V = head_dim), in float64, same keys for both.

    Each cell repeats the experiment with fresh keys, codebook and codes (seeds seed, seed + 1, ...) until it
    has read at least `min_reads` pairs, and averages: one draw of 4 pairs says little.
    """
    if head_dim < 1 or not pairs or min(pairs) < 1 or min_reads < 1:
        raise ValueError(f"head_dim, min_reads and every pair count must be at least 1, got {head_dim}, "
                         f"{min_reads} and {list(pairs)}.")
    points = []
    for n in pairs:
        trials = math.ceil(min_reads / n)
        cosines: dict[str, list[torch.Tensor]] = {"delta rule": [], "attention": []}
        hits = {"delta rule": 0, "attention": 0}
        for trial in range(trials):
            key_rows, codebook, codes = _pairs(n, head_dim, keys, seed + 1009 * n + trial)
            values = codebook[codes]
            for method, reads in (("delta rule", delta_rule_reads(key_rows, values)),
                                  ("attention", attention_reads(key_rows, values, temperature))):
                cos_written, right = score(reads, codebook, codes)
                cosines[method].append(cos_written)
                hits[method] += right
        for method, numbers in (("delta rule", head_dim * head_dim), ("attention", n * 2 * head_dim)):
            points.append(CapacityPoint(method, keys, head_dim, n, torch.cat(cosines[method]).mean().item(),
                                        hits[method] / (n * trials), numbers * STORED_BYTES))
    return points


def decay_row(head_dim: int, alpha: float, distances: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32),
              seed: int = 0) -> list[tuple[int, float]]:
    """Forgetting with distance: one pair written, then `d` further writes under orthogonal keys, decay alpha.

    Returns (d, retained) with retained = (read . v) / |v|^2 of the first pair, alpha^d in exact arithmetic
    (orthogonal later keys leave it untouched; only the gate shrinks it), measured through kda_recurrent.
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must lie in (0, 1], got {alpha}.")
    if max(distances) + 1 > head_dim:
        raise ValueError(f"distances up to {max(distances)} need head_dim > {max(distances)} orthogonal keys, "
                         f"got head_dim {head_dim}.")
    row = []
    for d in distances:
        key_rows, codebook, codes = _pairs(d + 1, head_dim, "orthogonal", seed)
        values = codebook[codes]
        first = delta_rule_reads(key_rows, values, math.log(alpha))[0]
        row.append((d, (first @ values[0]).item() / (values[0] @ values[0]).item()))
    return row


def pair_counts(head_dim: int) -> list[int]:
    """N from 1 to 4K: 1, K/4, K/2, 3K/4, K, K + 1, 3K/2, 2K, 3K, 4K (distinct, ascending)."""
    K = head_dim
    return sorted({1, max(1, K // 4), max(1, K // 2), max(1, 3 * K // 4), K, K + 1, 3 * K // 2, 2 * K, 3 * K, 4 * K})


def format_cliff(points: list[CapacityPoint]) -> str:
    """A table: one line per (keys, K, N), the delta rule and attention side by side."""
    by_cell: dict[tuple[str, int, int], dict[str, CapacityPoint]] = {}
    for p in points:
        by_cell.setdefault((p.keys, p.head_dim, p.pairs), {})[p.method] = p
    lines = [f"{'keys':<11}{'K':>4}{'N':>5}   {'delta rule: cos  exact  state':>31}   "
             f"{'attention: cos  exact  cache':>30}"]
    for (keys, K, n), cell in by_cell.items():
        d, a = cell["delta rule"], cell["attention"]
        lines.append(f"{keys:<11}{K:>4}{n:>5}   {d.cosine:>18.3f} {d.exact:>6.0%} {_kb(d.memory_bytes):>6}"
                     f"   {a.cosine:>16.3f} {a.exact:>6.0%} {_kb(a.memory_bytes):>6}")
    return "\n".join(lines)


def _kb(n: int) -> str:
    return f"{n / 1024:.1f}K" if n >= 1024 else f"{n}B"


__all__ = ["CapacityPoint", "KEY_KINDS", "VALUES", "TEMPERATURE", "unit_keys", "delta_rule_reads",
           "attention_reads", "score", "retrieval_cliff", "decay_row", "pair_counts", "format_cliff"]
