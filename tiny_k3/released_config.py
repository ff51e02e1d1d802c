"""A released config.json read into K3Config's fields (K3Config.from_released; the mapping is documented there).

It sits outside tiny_k3/released/ and imports nothing of tiny_k3 but its errors, so that tiny_k3/config.py can
use it without an import circle (the released package itself builds on K3Config).
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import ConfigError


class ReleasedFormatError(ValueError):
    """A released-format file that tiny-k3 cannot read; the message names what is wrong and what is allowed."""


# ---------------------------------------------------------------------------- config.json
def read_config_json(path) -> tuple[dict, dict]:
    """(the whole config.json, its text_config) of a file, a checkpoint folder holding config.json, or the
    already-read dict."""
    if isinstance(path, dict):
        whole = path
        text = whole.get("text_config", whole)
        if not isinstance(text, dict) or "hidden_size" not in text:
            raise ReleasedFormatError("config has no text_config with hidden_size; expected a K3 / Kimi Linear config.")
        return whole, text
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ReleasedFormatError(f"no config.json at {path}; a released checkpoint folder holds config.json, "
                                  f"model.safetensors.index.json and its shards.")
    try:
        whole = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReleasedFormatError(f"{path} is not valid JSON ({exc}).") from None
    text = whole.get("text_config", whole)
    if not isinstance(text, dict) or "hidden_size" not in text:
        raise ReleasedFormatError(f"{path} has no text_config with hidden_size; expected a K3 / Kimi Linear config.")
    return whole, text


# (field, the only value tiny-k3 models, why): anything else is an error naming the field
_FIXED = [
    ("moe_router_activation_func", "sigmoid", "the router is a sigmoid"),
    ("topk_method", "noaux_tc", "selection is top-k of score + bias (noaux_tc)"),
    ("moe_layer_freq", 1, "every layer after the dense ones is an MoE layer"),
    ("num_nextn_predict_layers", 0, "no multi-token-prediction layers"),
    ("tie_word_embeddings", False, "the embedding and the head are separate"),
    ("mla_use_nope", True, "MLA is NoPE (tiny-k3's RoPE switch is the K2 lineage's, not read from here)"),
    ("latent_moe_use_norm", True, "the latent MoE normalises the expert sum"),
]


def config_fields_from_released(path) -> dict:
    """The K3Config keyword arguments of a released config.json (a path, a folder or the dict; see
    `K3Config.from_released`)."""
    _, t = read_config_json(path)

    def need(key):
        if key not in t:
            raise ReleasedFormatError(f"config.json text_config has no {key!r}, which tiny-k3 needs.")
        return t[key]

    for key, value, why in _FIXED:
        if key in t and t[key] != value:
            raise ConfigError(f"config.json {key} = {t[key]!r}: tiny-k3 models only {value!r} ({why}).")
    groups, topk_group = t.get("num_expert_group", 1) or 1, t.get("topk_group", 1) or 1
    if groups > 1 and groups > topk_group:
        raise ConfigError(f"config.json num_expert_group = {groups} with topk_group = {topk_group}: tiny-k3 does "
                          f"not model grouped routing (allowed: num_expert_group 1, or topk_group >= it).")
    heads, kv_heads = need("num_attention_heads"), t.get("num_key_value_heads", need("num_attention_heads"))
    if kv_heads != heads:
        raise ConfigError(f"config.json num_key_value_heads = {kv_heads}: MLA has one latent for all heads, "
                          f"so it must equal num_attention_heads ({heads}).")
    if t.get("hidden_act") not in ("situ", "silu"):
        raise ConfigError(f"config.json hidden_act = {t.get('hidden_act')!r}: tiny-k3 models 'situ' (K3) and "
                          f"'silu' (SwiGLU).")
    lin = need("linear_attn_config")
    layers = need("num_hidden_layers")
    kda = set(lin.get("kda_layers", []))
    full = set(lin.get("full_attn_layers", []))
    if kda & full or kda | full != set(range(1, layers + 1)):
        raise ConfigError(f"config.json linear_attn_config: kda_layers and full_attn_layers must split the "
                          f"1-based layers 1..{layers} between them, each exactly once.")
    if lin.get("head_dim") is None or lin.get("num_heads") is None:
        raise ReleasedFormatError("config.json linear_attn_config needs head_dim and num_heads.")
    latent = t.get("routed_expert_hidden_size")
    block = t.get("attn_res_block_size")
    dtype = t.get("dtype", t.get("torch_dtype", "bfloat16"))
    return dict(
        vocab_size=need("vocab_size"), hidden_size=need("hidden_size"), num_layers=layers,
        layer_kinds=tuple("kda" if i + 1 in kda else "mla" for i in range(layers)),
        first_k_dense=need("first_k_dense_replace"), dense_intermediate=need("intermediate_size"),
        max_seq_len=need("max_position_embeddings"), rms_norm_eps=need("rms_norm_eps"), dtype=dtype,
        init_std=t.get("initializer_range", 0.02),
        kda_heads=lin["num_heads"], kda_head_dim=lin["head_dim"], kda_conv_kernel=lin.get("short_conv_kernel_size", 4),
        kda_gate_rank=lin["head_dim"],                      # f_a_proj: hidden_size -> head_dim
        kda_gate_lower_bound=lin.get("gate_lower_bound"),
        kda_output_gate_rank=None if lin.get("use_full_rank_gate", False) else lin["head_dim"],
        mla_heads=heads, q_lora_rank=t.get("q_lora_rank"), kv_lora_rank=need("kv_lora_rank"),
        qk_nope_dim=need("qk_nope_head_dim"), qk_rope_dim=need("qk_rope_head_dim"), v_head_dim=need("v_head_dim"),
        mla_output_gate=bool(t.get("mla_use_output_gate", False)), mla_rope=False, mla_norm_eps=None,
        moe_kind="latent" if latent is not None else "plain",
        num_experts=need("num_experts"), top_k=need("num_experts_per_token"),
        moe_intermediate=need("moe_intermediate_size"), latent_dim=latent if latent is not None else 32,
        num_shared_experts=t.get("num_shared_experts") or 0, shared_intermediate=need("moe_intermediate_size"),
        routed_scaling=float(t.get("routed_scaling_factor", 1.0)), renormalize=bool(t.get("moe_renormalize", True)),
        mlp_act="situ" if t["hidden_act"] == "situ" else "swiglu",
        situ_beta_gate=float(t.get("activation_situ_beta", 4.0)),
        situ_beta_up=float(t.get("activation_situ_linear_beta", 25.0)),
        residual="standard" if block is None else "block",
        attnres_block_size=2 * block if block is not None else 12,   # layers -> sublayers
    )
