"""Parameter counts read off the real modules, built on the meta device (no memory, no hand formula)."""

from __future__ import annotations

from functools import lru_cache

from .config import K3Config
from .model import TinyK3

PARTS = ("routed_experts", "kda", "mla", "shared_experts", "latent_proj", "router", "dense_mlp",
         "embedding", "lm_head", "norms_attnres")


def _part_of(model, name: str) -> str:
    """Which part of K3 a parameter name belongs to (k3_facts.md §1d's breakdown)."""
    top = name.split(".")[0]
    if top in ("embed", "lm_head"):
        return "embedding" if top == "embed" else "lm_head"
    if top != "blocks":
        return "norms_attnres"                       # final_norm, out_res
    _, index, sub, *rest = name.split(".")
    block = model.blocks[int(index)]
    if sub == "attn":
        return block.kind                            # "kda" or "mla"
    if sub != "mlp":
        return "norms_attnres"                       # attn_norm, mlp_norm, attn_res, mlp_res
    if block.mlp_kind == "dense":
        return "dense_mlp"
    head = rest[0]
    if head in ("w1", "w2", "w3"):
        return "routed_experts"
    if head == "router":
        return "router"
    if head == "shared":
        return "shared_experts"
    return "latent_proj"                             # down, up, latent_norm


@lru_cache(maxsize=32)
def parameter_breakdown(config: K3Config) -> dict[str, int]:
    """Parameters per part of the model, counted from a TinyK3 built on the meta device."""
    model = TinyK3(config, device="meta")
    parts = dict.fromkeys(PARTS, 0)
    for name, p in model.named_parameters():
        parts[_part_of(model, name)] += p.numel()
    return parts


def parameter_counts(config: K3Config) -> tuple[int, int]:
    """(total, active) parameters. Active = what one token touches: every non-expert weight
    except the input embedding (a lookup, not a matmul), plus top_k of num_experts routed experts
    (the convention of K3's 104B figure, k3_facts.md §1d)."""
    parts = parameter_breakdown(config)
    total = sum(parts.values())
    idle_experts = parts["routed_experts"] * (config.num_experts - config.top_k) // config.num_experts
    return total, total - parts["embedding"] - idle_experts


def selection_bias_count(config: K3Config) -> int:
    """Values of the routers' selection bias over every MoE layer (K3: 92 layers x 896 = 82,432).

    tiny-k3 keeps the bias as a buffer (it is moved by `Router.update_bias`, never by the optimiser), so
    `parameter_counts` leaves it out; the released code holds it as a Parameter, `gate.e_score_correction_bias`
    (PipeNetwork/kimi-k3-mlx@fe0738f reference/modeling_kimi_linear.py line 693), so a count of the released
    module tree is `parameter_counts(config)[0] + selection_bias_count(config)`.
    """
    return len(config.moe_layers) * config.num_experts
