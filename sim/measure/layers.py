"""One layer of each kind at real widths, built from tiny_k3's own modules, and its decode step.

Every module is constructed on the `meta` device (no memory) and then only the tensors one decode step
reads are allocated (`materialize`). Weights are random: a seeded block of N(0, init_std^2) values tiled
through each tensor. A decode step's time does not depend on the values, and drawing 4.5 billion fresh
normal numbers takes minutes on a laptop CPU, where tiling takes seconds.

Two decode steps are written here rather than in tiny_k3, because they are what an inference engine
runs, not what the simulator steps through:

* `absorbed_mla_step`: gated MLA's decode in the absorbed form (mla.md §2; DeepSeek-V2 §2.1.3; the one-buffer
  layout of FlashMLA):
  W_UK is folded into the query and W_UV applied after the attention, so each cached token is read as its
  576 stored values (kv_lora_rank 512 + qk_rope_dim 64), never expanded into 96 heads of keys and values.
  tests/test_measure.py checks it against `GatedMLA.forward` (the non-absorbed form) in float64.
* `TouchedMoE`: a latent-MoE layer that holds only the experts one token's step touches (its top-k routed
  experts; the shared experts and router are kept whole). The test checks it against the full layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from tiny_k3.config import K3Config
from tiny_k3.kda import KDALayer
from tiny_k3.mla import GatedMLA
from tiny_k3.moe import GatedMLP, LatentMoE, situ_glu
from tiny_k3.norm import RMSNorm

TILE = 1_000_003  # values in the random block tiled through every weight (a prime: no alignment with rows)
DT_BIAS = math.log(math.expm1(0.01))  # softplus^-1(dt) at dt = 0.01, the middle of fla's dt range (kda.md §3)


# ---------------------------------------------------------------------------- widths

@dataclass(frozen=True)
class Widths:
    """The two models whose layers are measured: K3 (`k3`) and a K2-shaped model in the same config language.

    k2: 61 layers, all MLA, 1 dense layer, 384 experts top-8, 1 shared expert, no latent (routed experts
    at the full width), MLA 64 heads (docs/k2_config.md).
    """

    name: str
    k3: K3Config
    k2: K3Config


def k2_config(k3_widths: K3Config | None = None) -> K3Config:
    """Kimi K2's config.json values (docs/k2_config.md; sim.costs.K2), or a tiny model of the same shape.

    With `k3_widths` given (a tiny preset) the K2-shaped model keeps K2's head, expert and layer counts
    and K2's ratios of widths, scaled to that preset's hidden size.
    """
    from sim.costs import K2

    if k3_widths is None:
        return K3Config(
            name="k2", vocab_size=K2["vocab"], hidden_size=K2["d"], num_layers=K2["layers"],
            layer_kinds=("mla",) * K2["layers"], first_k_dense=K2["dense"], dense_intermediate=K2["dense_inter"],
            max_seq_len=1 << 20, dtype="bfloat16", mla_heads=K2["heads"], q_lora_rank=K2["q_lora"],
            kv_lora_rank=K2["kv_lora"], qk_nope_dim=K2["nope"], qk_rope_dim=K2["rope"], v_head_dim=K2["v"],
            num_experts=K2["experts"], top_k=K2["top_k"], moe_intermediate=K2["moe_inter"], latent_dim=K2["d"],
            num_shared_experts=K2["shared"], shared_intermediate=K2["moe_inter"], routed_scaling=2.827,
        )
    c = k3_widths
    return c.replace(name=f"k2-shaped-{c.name}", num_layers=K2["layers"], layer_kinds=("mla",) * K2["layers"],
                     first_k_dense=K2["dense"], mla_heads=max(1, c.mla_heads * 2 // 3),
                     num_experts=K2["experts"], top_k=K2["top_k"], latent_dim=c.hidden_size,
                     num_shared_experts=K2["shared"], shared_intermediate=c.moe_intermediate)


def widths(tiny: bool = False) -> Widths:
    """K3's real widths (`k3` preset) or, for tests, K3's exact topology at tiny widths (`k3-topo`)."""
    if tiny:
        topo = K3Config.preset("k3-topo")
        return Widths("k3-topo", topo, k2_config(topo))
    return Widths("k3", K3Config.preset("k3"), k2_config())


# ---------------------------------------------------------------------------- materialising

def fill_random(t: torch.Tensor, std: float, seed: int) -> torch.Tensor:
    """Fill t in place with a seeded block of N(0, std^2) values, tiled (see the module docstring)."""
    n = t.numel()
    g = torch.Generator().manual_seed(seed)
    block = (torch.randn(min(TILE, n), generator=g) * std).to(device=t.device, dtype=t.dtype)
    flat = t.view(-1)
    for start in range(0, n, TILE):
        stop = min(n, start + TILE)
        flat[start:stop].copy_(block[: stop - start])
    return t


@torch.no_grad()
def materialize(module: nn.Module, device, dtype: torch.dtype, std: float, seed: int = 0) -> nn.Module:
    """Allocate every meta tensor of `module` on `device`: norms at 1, KDA's A_log at 0 and dt_bias at
    softplus^-1(0.01) (fla's start, kda.md §3), buffers at 0 in their own dtype, other weights random."""
    for index, m in enumerate(module.modules()):
        for name, p in list(m.named_parameters(recurse=False)):
            if not p.is_meta:
                continue
            t = torch.empty(p.shape, device=device, dtype=dtype)
            if isinstance(m, RMSNorm) or name == "o_norm_weight":
                t.fill_(1.0)
            elif name == "A_log":
                t.zero_()
            elif name == "dt_bias":
                t.fill_(DT_BIAS)
            else:
                fill_random(t, std, seed + 7919 * index + len(name))
            setattr(m, name, nn.Parameter(t, requires_grad=False))
        for name, b in list(m.named_buffers(recurse=False)):
            if b is not None and b.is_meta:
                m.register_buffer(name, torch.zeros(b.shape, device=device, dtype=b.dtype))
    return module


def tensor_bytes(module: nn.Module) -> int:
    """Bytes of every parameter and buffer of `module`, read off the live tensors."""
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


# ---------------------------------------------------------------------------- the layers

class LMHead(nn.Module):
    """TinyK3's final RMSNorm and LM head (tiny_k3/model.py): x [B, 1, D] -> logits [B, 1, vocab]."""

    def __init__(self, config: K3Config, device=None, dtype=None):
        super().__init__()
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device=device, dtype=dtype)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.final_norm(x))


def build_kda(config: K3Config, device, dtype) -> KDALayer:
    return materialize(KDALayer(config, device="meta", dtype=dtype), device, dtype, config.init_std)


def build_mla(config: K3Config, device, dtype, gated: bool = True) -> GatedMLA:
    """K3's gated MLA; `gated=False` drops the output gate (K2's plain MLA has none)."""
    mla = GatedMLA(config, device="meta", dtype=dtype)
    if not gated:
        mla.g_proj = None
    return materialize(mla, device, dtype, config.init_std)


def build_dense(config: K3Config, device, dtype) -> GatedMLP:
    mlp = GatedMLP(config.hidden_size, config.dense_intermediate, config, device="meta", dtype=dtype)
    return materialize(mlp, device, dtype, config.init_std)


def build_head(config: K3Config, device, dtype) -> LMHead:
    return materialize(LMHead(config, device="meta", dtype=dtype), device, dtype, config.init_std)


# ---------------------------------------------------------------------------- absorbed MLA decode

def latent_cache(config: K3Config, tokens: int, device, dtype, capacity: int | None = None) -> torch.Tensor:
    """A filled latent cache kv [1, capacity, kv_lora_rank + qk_rope_dim] whose first `tokens` rows hold
    random values; capacity defaults to tokens + 1 (room for the row the next decode step writes)."""
    capacity = tokens + 1 if capacity is None else capacity
    kv = torch.zeros(1, capacity, config.mla_cache_width, device=device, dtype=dtype)
    if tokens:
        fill_random(kv[:, :tokens], 1.0, seed=tokens)  # c is RMS-normalised: unit scale
    return kv


def absorbed_mla_step(mla: GatedMLA, x: torch.Tensor, kv: torch.Tensor, length: int) -> torch.Tensor:
    """One decode step of gated MLA in the absorbed form. x [B, 1, D] (already RMS-normed) -> y [B, 1, D].

    kv [B, capacity, r + rope] is the preallocated cache: rows 0..length-1 are the earlier tokens' [c, k_r];
    this step writes the new token's row at `length` and attends over rows 0..length. Per head h, with
    W_kvb viewed as [H, nope + v, r] = [W_UK; W_UV]:
        q_lat = W_UK[h]^T q_nope                      the query moved into the latent space    [B, H, r]
        score_s = ([q_lat, q_rope] . kv_s) * scale    one dot product with the stored row       [B, H, S]
        o = W_UV[h] (sum_s p_s c_s)                   values leave the latent space once         [B, H, v]
        y = W_o(o * sigmoid(W_g x))                   (no gate where mla.g_proj is None, as in K2)
    which equals GatedMLA.forward's expansion into per-head keys and values (q.k_s = q_lat.c_s + q_rope.k_r,s).
    """
    B = x.shape[0]
    r, rope, heads, nope, v = mla.kv_rank, mla.rope, mla.heads, mla.nope, mla.v_dim
    latent, k_rope = mla.kv_a_proj(x).split([r, rope], dim=-1)
    kv[:, length, :r] = mla.kv_norm(latent)[:, 0]
    kv[:, length, r:] = k_rope[:, 0]
    rows = kv[:, : length + 1]                                               # [B, S, r + rope]
    q_nope, q_rope = mla.project_q(x)[:, 0].split([nope, rope], dim=-1)     # [B, H, nope], [B, H, rope]
    w_uk, w_uv = mla.kv_b_proj.weight.view(heads, nope + v, r).split([nope, v], dim=1)
    query = torch.cat([torch.einsum("bhn,hnr->bhr", q_nope, w_uk), q_rope], dim=-1)   # [B, H, r + rope]
    scores = torch.bmm(query, rows.transpose(1, 2)) * mla.scale                        # [B, H, S]
    probs = scores.softmax(dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(rows.dtype)
    o = torch.einsum("bhr,hvr->bhv", torch.bmm(probs, rows[..., :r]), w_uv)          # [B, H, v]
    if mla.g_proj is not None:
        o = o * torch.sigmoid(mla.g_proj(x)).view(B, heads, v)
    return mla.o_proj(o.reshape(B, 1, heads * v))


# ---------------------------------------------------------------------------- MoE with the touched experts only

class TouchedMoE(nn.Module):
    """A latent-MoE layer holding only the routed experts one token's decode step uses.

    Router, down projection, latent norm, up projection and shared experts are LatentMoE's own modules
    (kept whole: a step reads all of them); w1, w3 [n, m, l] and w2 [n, l, m] are the n held experts, in
    the order of `expert_ids` [n]. `latent=False` replaces down, latent norm and up by identities: a plain
    DeepSeek/K2 MoE whose experts run at the full width. forward(x [1, 1, D]) equals LatentMoE.forward for
    a token routed to held experts only (tests/test_measure.py); another token is a clear error.
    """

    def __init__(self, shell: LatentMoE, expert_ids: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                 w2: torch.Tensor, latent: bool = True):
        super().__init__()
        self.config = shell.config
        self.router, self.shared = shell.router, shell.shared
        self.down, self.latent_norm, self.up = ((shell.down, shell.latent_norm, shell.up) if latent
                                                else (nn.Identity(), nn.Identity(), nn.Identity()))
        self.w1, self.w3, self.w2 = (nn.Parameter(w, requires_grad=False) for w in (w1, w3, w2))
        slots = torch.full((self.config.num_experts,), -1, dtype=torch.long, device=w1.device)
        slots[expert_ids] = torch.arange(len(expert_ids), device=w1.device)
        self.register_buffer("expert_ids", expert_ids.clone())
        self.register_buffer("slots", slots)  # global expert id -> held slot, -1 where not held

    @classmethod
    @torch.no_grad()
    def from_layer(cls, moe: LatentMoE, x: torch.Tensor) -> "TouchedMoE":
        """Keep only the experts the token x [1, 1, D] is routed to (what a step loads of a checkpoint)."""
        ids = moe.router(x).expert_ids.reshape(-1)
        return cls(moe, ids, moe.w1[ids].clone(), moe.w3[ids].clone(), moe.w2[ids].clone())

    @classmethod
    @torch.no_grad()
    def random(cls, config: K3Config, x: torch.Tensor, device, dtype, latent: bool = True) -> "TouchedMoE":
        """Real-width layer without the idle experts: everything but the expert stacks is allocated and
        random, x is routed, and only its top_k experts get memory."""
        shell = LatentMoE(config, device="meta", dtype=dtype)
        shell.w1 = shell.w2 = shell.w3 = None                         # the 896-expert stacks are never allocated
        if not latent:
            shell.down = shell.latent_norm = shell.up = None
        materialize(shell, device, dtype, config.init_std)
        ids = shell.router(x).expert_ids.reshape(-1)
        m, l = config.moe_intermediate, config.latent_dim
        stacks = [torch.empty(len(ids), *shape, device=device, dtype=dtype) for shape in ((m, l), (m, l), (l, m))]
        for i, w in enumerate(stacks):
            fill_random(w, config.init_std, seed=101 + i)
        return cls(shell, ids, *stacks, latent=latent)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [1, 1, D] -> [1, 1, D]: route, run the held experts (all n at once, no weight copies), mix, up, shared."""
        if x.shape[:2] != (1, 1):
            raise ValueError(f"TouchedMoE runs one decode token, x [1, 1, D]; got shape {list(x.shape)}.")
        routing = self.router(x)
        local = self.slots[routing.expert_ids.reshape(-1)]                 # [k] held slots of the chosen experts
        if bool((local < 0).any()):
            raise ValueError("this token is routed to an expert that TouchedMoE does not hold; "
                             "build it from this token (TouchedMoE.from_layer).")
        n, l = self.w1.shape[0], self.w1.shape[2]
        z = self.down(x).reshape(1, l)
        mix = z.new_zeros(n).index_add(0, local, routing.weights.reshape(-1).to(z.dtype))   # [n] weight per slot
        rows = z.expand(n, l).unsqueeze(-1)                                                  # [n, l, 1]
        h = situ_glu(torch.bmm(self.w1, rows), torch.bmm(self.w3, rows),
                     self.config.situ_beta_gate, self.config.situ_beta_up)                   # [n, m, 1]
        y = torch.bmm(self.w2, h * mix.view(n, 1, 1)).sum(0).view(1, 1, l)                  # [1, 1, l]
        out = self.up(self.latent_norm(y))          # RMSNorm after the full expert sum (k3_facts.md §1c)
        return out if self.shared is None else out + self.shared(x)


# ---------------------------------------------------------------------------- MoE at batch B, in two timed parts

def moe_shell_step(moe: TouchedMoE, x: torch.Tensor) -> torch.Tensor:
    """The part of a batch-B MoE step that every token does whatever its experts: x [B, 1, D] -> [B, 1, D].

    The router's scores and top-k for all B tokens, the down projection, the latent norm and up projection (applied
    here to the down-projected rows, which have the shape of the expert mix they stand in for) and the shared
    experts. The routed experts' GEMMs are timed apart (`moe_expert_step`) and composed by the experts touched.
    """
    moe.router(x)
    y = moe.up(moe.latent_norm(moe.down(x)))
    return y if moe.shared is None else y + moe.shared(x)


def moe_expert_step(moe: TouchedMoE, rows: torch.Tensor) -> torch.Tensor:
    """Every held routed expert's SiTU-GLU on its own m rows: rows [n, l, m] -> [n, l, m] (n = held experts)."""
    h = situ_glu(torch.bmm(moe.w1, rows), torch.bmm(moe.w3, rows), moe.config.situ_beta_gate, moe.config.situ_beta_up)
    return torch.bmm(moe.w2, h)


def rows_per_expert(config: K3Config, batch: int) -> float:
    """Rows a touched expert gets on average when `batch` tokens each pick top_k of the experts uniformly:
    B k / (expected experts touched) (sim.costs.expected_experts_touched, k3_facts.md §5b)."""
    from sim.costs import expected_experts_touched

    return batch * config.top_k / expected_experts_touched(config.num_experts, config.top_k, batch)
