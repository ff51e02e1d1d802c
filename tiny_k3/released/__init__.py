"""The released K3 in its own format: its config.json, its tensor names and shapes, and their tiny_k3 names.

Facts, not code, come from the public copy of Moonshot's release in PipeNetwork/kimi-k3-mlx at commit fe0738f
(reference/config.json, reference/modeling_kimi_linear.py, reference/modeling_kimi_k3.py,
reference/model.safetensors.index.json.gz); docs/released.md describes the layout and the mapping.

- `config_fields_from_released(path)`: the K3Config fields of a released config.json (`K3Config.from_released`).
- `released_tensors(config)`: every language-model tensor of the released layout, name -> (shape, dtype).
- `mapping(config)`: each of them -> the tiny_k3 state_dict entry it fills, and how (`Target`).
- `summarize_index(index, config)`: the compact table of an index json (templates, counts, shapes, bytes);
  `K3_TABLE` is that table for the real index, committed as tiny_k3/released/k3_index_table.json.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import NamedTuple

from ..config import ConfigError, K3Config
from ..mxfp4 import GROUP

HERE = Path(__file__).parent
RELEASED_CONFIG = HERE / "config.json"            # the released config.json, verbatim (SOURCE.md)
K3_TABLE = HERE / "k3_index_table.json"           # summarize_index of the released index (SOURCE.md)
SOURCE = "PipeNetwork/kimi-k3-mlx@fe0738f"

LM = "language_model."                            # the text tower's prefix in the multimodal checkpoint
LAYER = LM + "model.layers.{layer}."
EXPERT = LAYER + "block_sparse_moe.experts.{expert}."
NOT_LANGUAGE = ("vision_tower.", "mm_projector.")  # what the checkpoint holds beside the text tower


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


def config_json_for(config: K3Config) -> dict:
    """A config.json in the released layout for a K3-shaped config: what a synthetic checkpoint ships.

    The fields are the released file's own (tiny_k3/released/config.json) with the shape fields replaced;
    `config_fields_from_released(config_json_for(c))` gives c's fields back (tests/test_released.py)."""
    if config.moe_kind != "latent" or config.residual != "block" or config.attnres_block_size % 2:
        raise ConfigError("config_json_for writes K3's layout: latent MoE and Block AttnRes with a whole number "
                          "of layers per block.")
    whole = json.loads(RELEASED_CONFIG.read_text())
    t = whole["text_config"]
    t.update(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
        first_k_dense_replace=config.first_k_dense, intermediate_size=config.dense_intermediate,
        max_position_embeddings=config.max_seq_len, rms_norm_eps=config.rms_norm_eps, dtype=config.dtype,
        initializer_range=config.init_std, num_attention_heads=config.mla_heads, num_key_value_heads=config.mla_heads,
        q_lora_rank=config.q_lora_rank, kv_lora_rank=config.kv_lora_rank, qk_nope_head_dim=config.qk_nope_dim,
        qk_rope_head_dim=config.qk_rope_dim, v_head_dim=config.v_head_dim, mla_use_output_gate=config.mla_output_gate,
        num_experts=config.num_experts, num_experts_per_token=config.top_k,
        moe_intermediate_size=config.moe_intermediate, routed_expert_hidden_size=config.latent_dim,
        num_shared_experts=config.num_shared_experts, routed_scaling_factor=config.routed_scaling,
        moe_renormalize=config.renormalize, activation_situ_beta=config.situ_beta_gate,
        activation_situ_linear_beta=config.situ_beta_up, attn_res_block_size=config.attnres_block_size // 2,
    )
    if config.shared_intermediate != config.moe_intermediate or config.kda_gate_rank != config.kda_head_dim:
        raise ConfigError("the released layout ties shared_intermediate to moe_intermediate and kda_gate_rank to "
                          "kda_head_dim; this config does not.")
    t["linear_attn_config"] = dict(
        t["linear_attn_config"], head_dim=config.kda_head_dim, num_heads=config.kda_heads,
        short_conv_kernel_size=config.kda_conv_kernel, gate_lower_bound=config.kda_gate_lower_bound,
        use_full_rank_gate=config.kda_output_gate_rank is None,
        kda_layers=[i + 1 for i in config.kda_layers], full_attn_layers=[i + 1 for i in config.mla_layers])
    return whole


# ---------------------------------------------------------------------------- the released tensors
class Spec(NamedTuple):
    shape: tuple[int, ...]
    dtype: str            # safetensors dtype name: "BF16", "F32", "U8"


_ST_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "U8": 1}
ST_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "U8": "uint8"}   # -> torch
_ST_OF = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64"}


def spec_bytes(spec: Spec) -> int:
    return math.prod(spec.shape) * _ST_BYTES[spec.dtype]


def a_log_length(config: K3Config) -> int:
    """A_log's stored length: K3 ships [128] = head_dim, its 96 per-head values then 32 zeros
    (the source repo's scripts/PARITY notes; the released code allocates [num_heads],
    modeling_kimi_linear.py l. 520)."""
    return max(config.kda_head_dim, config.kda_heads)


def expert_tensors(config: K3Config, layer: int, expert: int) -> dict[str, Spec]:
    """The six tensors of one routed expert: w1 (gate), w2 (down), w3 (up), each MXFP4 `weight_packed`
    [out, in/2] and `weight_scale` [out, in/32], U8."""
    m, l, x = config.moe_intermediate, config.latent_dim, EXPERT.format(layer=layer, expert=expert)
    out = {}
    for name, (rows, cols) in (("w1", (m, l)), ("w2", (l, m)), ("w3", (m, l))):
        out[x + name + ".weight_packed"] = Spec((rows, cols // 2), "U8")
        out[x + name + ".weight_scale"] = Spec((rows, cols // GROUP), "U8")
    return out


def released_tensors(config: K3Config, experts: bool = True) -> dict[str, Spec]:
    """Every language-model tensor of the released layout for `config`, in checkpoint order, with its shape and
    safetensors dtype. Shapes follow the released modules (modeling_kimi_linear.py: KimiDeltaAttention l. 477,
    KimiMLAAttention l. 335, KimiSparseMoeBlock l. 762, KimiDecoderLayer l. 877, KimiLinearModel l. 1090) and the
    quantization config (routed experts MXFP4: `weight_packed` [out, in/2] U8, `weight_scale` [out, in/32] U8).
    Matrices and norm gains are in the config's dtype (BF16 for K3); KDA's A_log and dt_bias (float32 Parameters,
    l. 520, 526), its short-conv weights and o_norm gain (fla modules), and the selection bias are F32. The index
    records no dtypes: this assignment is the one whose bytes sum to the index's total_size exactly
    (1,560,860,324,864, with the vision tower in BF16; tests/test_released.py), and a reader checks each
    tensor's dtype in the shard headers anyway (sim/real.py). experts=False leaves the routed experts out
    (`expert_tensors` gives one expert's)."""
    c = config
    if c.moe_kind != "latent" or c.residual != "block":
        raise ConfigError("the released layout is K3's: latent MoE and Block AttnRes.")
    w = _ST_OF[c.dtype]
    D, H, K, E, m, l = c.hidden_size, c.kda_heads, c.kda_head_dim, c.num_experts, c.moe_intermediate, c.latent_dim
    out: dict[str, Spec] = {}
    out[LM + "model.embed_tokens.weight"] = Spec((c.vocab_size, D), w)
    for i, kind in enumerate(c.layer_kinds):
        p = LAYER.format(layer=i)
        a = p + "self_attn."
        if kind == "kda":
            for name in ("q_proj", "k_proj", "v_proj"):
                out[a + name + ".weight"] = Spec((H * K, D), w)
            for name in ("q_conv1d", "k_conv1d", "v_conv1d"):
                out[a + name + ".weight"] = Spec((H * K, 1, c.kda_conv_kernel), "F32")
            out[a + "A_log"] = Spec((a_log_length(c),), "F32")
            out[a + "f_a_proj.weight"] = Spec((c.kda_gate_rank, D), w)
            out[a + "f_b_proj.weight"] = Spec((H * K, c.kda_gate_rank), w)
            out[a + "dt_bias"] = Spec((H * K,), "F32")
            out[a + "b_proj.weight"] = Spec((H, D), w)
            out[a + "g_proj.weight"] = Spec((H * K, D), w)
            out[a + "o_norm.weight"] = Spec((K,), "F32")
            out[a + "o_proj.weight"] = Spec((D, H * K), w)
        else:
            Hm = c.mla_heads
            out[a + "q_a_proj.weight"] = Spec((c.q_lora_rank, D), w)
            out[a + "q_a_layernorm.weight"] = Spec((c.q_lora_rank,), w)
            out[a + "q_b_proj.weight"] = Spec((Hm * c.qk_head_dim, c.q_lora_rank), w)
            out[a + "kv_a_proj_with_mqa.weight"] = Spec((c.kv_lora_rank + c.qk_rope_dim, D), w)
            out[a + "kv_a_layernorm.weight"] = Spec((c.kv_lora_rank,), w)
            out[a + "kv_b_proj.weight"] = Spec((Hm * (c.qk_nope_dim + c.v_head_dim), c.kv_lora_rank), w)
            out[a + "o_proj.weight"] = Spec((D, Hm * c.v_head_dim), w)
            out[a + "g_proj.weight"] = Spec((Hm * c.v_head_dim, D), w)
        if i < c.first_k_dense:
            f = c.dense_intermediate
            out[p + "mlp.gate_proj.weight"] = Spec((f, D), w)
            out[p + "mlp.up_proj.weight"] = Spec((f, D), w)
            out[p + "mlp.down_proj.weight"] = Spec((D, f), w)
        else:
            s = p + "block_sparse_moe."
            for e in range(E if experts else 0):
                out |= expert_tensors(c, i, e)
            out[s + "gate.weight"] = Spec((E, D), w)
            out[s + "gate.e_score_correction_bias"] = Spec((E,), "F32")
            hs = c.num_shared_experts * c.shared_intermediate
            out[s + "shared_experts.gate_proj.weight"] = Spec((hs, D), w)
            out[s + "shared_experts.up_proj.weight"] = Spec((hs, D), w)
            out[s + "shared_experts.down_proj.weight"] = Spec((D, hs), w)
            out[s + "routed_expert_down_proj.weight"] = Spec((l, D), w)
            out[s + "routed_expert_up_proj.weight"] = Spec((D, l), w)
            out[s + "routed_expert_norm.weight"] = Spec((l,), w)
        out[p + "input_layernorm.weight"] = Spec((D,), w)
        out[p + "post_attention_layernorm.weight"] = Spec((D,), w)
        for site in ("self_attention", "mlp"):
            out[p + f"{site}_res_norm.weight"] = Spec((D,), w)
            out[p + f"{site}_res_proj.weight"] = Spec((1, D), w)
    out[LM + "model.norm.weight"] = Spec((D,), w)
    out[LM + "model.output_attn_res_norm.weight"] = Spec((D,), w)
    out[LM + "model.output_attn_res_proj.weight"] = Spec((1, D), w)
    out[LM + "lm_head.weight"] = Spec((c.vocab_size, D), w)
    return out


def vision_tensors(config_json: dict) -> dict[str, Spec]:
    """The vision tower's and projector's tensors (BF16), from vision_config (modeling_kimi_k3.py: MoonViT
    l. 461-591, PatchMergerMLPV2 l. 783): not mapped onto tiny_k3, only counted, so the index's total_size
    can be checked byte for byte."""
    v = config_json["vision_config"]
    d, f, q = v["vt_hidden_size"], v["vt_intermediate_size"], v["qkv_hidden_size"]
    p, merged, text = v["patch_size"], v["mm_hidden_size"] * math.prod(v["merge_kernel_size"]), v["text_hidden_size"]
    out = {"vision_tower.patch_embed.proj.weight": Spec((d, 3, p, p), "BF16"),
           "vision_tower.patch_embed.pos_emb.weight": Spec((v["init_pos_emb_height"], v["init_pos_emb_width"], d),
                                                           "BF16")}
    for b in range(v["vt_num_hidden_layers"]):
        x = f"vision_tower.encoder.blocks.{b}."
        out |= {x + "norm0.weight": Spec((d,), "BF16"), x + "norm1.weight": Spec((d,), "BF16"),
                x + "wqkv.weight": Spec((3 * q, d), "BF16"), x + "wo.weight": Spec((d, q), "BF16"),
                x + "mlp.fc0.weight": Spec((f, d), "BF16"), x + "mlp.fc1.weight": Spec((d, f), "BF16")}
    out["vision_tower.encoder.final_layernorm.weight"] = Spec((d,), "BF16")
    out["mm_projector.proj.0.weight"] = Spec((merged, merged), "BF16")
    out["mm_projector.proj.2.weight"] = Spec((text, merged), "BF16")
    out["mm_projector.post_norm.weight"] = Spec((text,), "BF16")
    return out


# ---------------------------------------------------------------------------- released name -> tiny_k3 name
class Target(NamedTuple):
    """Where a released tensor goes in a TinyK3 state_dict.

    how: "copy" (same shape), "row" ([1, D] -> [D]: a depth query), "pad" (A_log: the first `kda_heads`
    values; the rest must be 0), "packed" / "scale" (one expert's MXFP4 codes / scales -> row `expert` of the
    stacked [E, out, in] parameter, after decoding), "buffer" (the selection bias: a buffer in tiny_k3).
    """

    tiny: str
    how: str
    expert: int | None = None


_ATTN = {  # released self_attn.* -> tiny blocks.i.attn.*
    "q_proj.weight": "q_proj.weight", "k_proj.weight": "k_proj.weight", "v_proj.weight": "v_proj.weight",
    "q_conv1d.weight": "q_conv.weight", "k_conv1d.weight": "k_conv.weight", "v_conv1d.weight": "v_conv.weight",
    "f_a_proj.weight": "f_a_proj.weight", "f_b_proj.weight": "f_b_proj.weight", "dt_bias": "dt_bias",
    "b_proj.weight": "b_proj.weight", "g_proj.weight": "g_proj.weight", "o_norm.weight": "o_norm_weight",
    "o_proj.weight": "o_proj.weight",
    "q_a_proj.weight": "q_a_proj.weight", "q_a_layernorm.weight": "q_norm.weight", "q_b_proj.weight": "q_b_proj.weight",
    "kv_a_proj_with_mqa.weight": "kv_a_proj.weight", "kv_a_layernorm.weight": "kv_norm.weight",
    "kv_b_proj.weight": "kv_b_proj.weight",
}
_LAYER = {  # released layers.i.* -> tiny blocks.i.*
    "input_layernorm.weight": ("attn_norm.weight", "copy"),
    "post_attention_layernorm.weight": ("mlp_norm.weight", "copy"),
    "self_attention_res_norm.weight": ("attn_res.key_norm", "copy"),
    "self_attention_res_proj.weight": ("attn_res.query", "row"),
    "mlp_res_norm.weight": ("mlp_res.key_norm", "copy"),
    "mlp_res_proj.weight": ("mlp_res.query", "row"),
    "mlp.gate_proj.weight": ("mlp.w1.weight", "copy"), "mlp.up_proj.weight": ("mlp.w3.weight", "copy"),
    "mlp.down_proj.weight": ("mlp.w2.weight", "copy"),
    "block_sparse_moe.gate.weight": ("mlp.router.weight", "copy"),
    "block_sparse_moe.gate.e_score_correction_bias": ("mlp.router.bias", "buffer"),
    "block_sparse_moe.routed_expert_down_proj.weight": ("mlp.down.weight", "copy"),
    "block_sparse_moe.routed_expert_norm.weight": ("mlp.latent_norm.weight", "copy"),
    "block_sparse_moe.routed_expert_up_proj.weight": ("mlp.up.weight", "copy"),
    "block_sparse_moe.shared_experts.gate_proj.weight": ("mlp.shared.w1.weight", "copy"),
    "block_sparse_moe.shared_experts.up_proj.weight": ("mlp.shared.w3.weight", "copy"),
    "block_sparse_moe.shared_experts.down_proj.weight": ("mlp.shared.w2.weight", "copy"),
}
_TOP = {
    LM + "model.embed_tokens.weight": ("embed.weight", "copy"), LM + "lm_head.weight": ("lm_head.weight", "copy"),
    LM + "model.norm.weight": ("final_norm.weight", "copy"),
    LM + "model.output_attn_res_norm.weight": ("out_res.key_norm", "copy"),
    LM + "model.output_attn_res_proj.weight": ("out_res.query", "row"),
}
_LAYER_RE = re.compile(r"language_model\.model\.layers\.(\d+)\.(.+)")
_EXPERT_RE = re.compile(r"block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight_(packed|scale)")


def target_of(name: str) -> Target | None:
    """The tiny_k3 entry a released tensor name fills; None for what tiny-k3 does not model (the vision tower
    and projector). An unknown language-model name is a ReleasedFormatError."""
    if name.startswith(NOT_LANGUAGE):
        return None
    if name in _TOP:
        return Target(*_TOP[name])
    match = _LAYER_RE.fullmatch(name)
    if match:
        layer, rest = match.groups()
        block = f"blocks.{layer}."
        expert = _EXPERT_RE.fullmatch(rest)
        if expert:
            e, w, part = expert.groups()
            return Target(block + "mlp." + w, part, int(e))
        if rest in _LAYER:
            tiny, how = _LAYER[rest]
            return Target(block + tiny, how)
        if rest == "self_attn.A_log":
            return Target(block + "attn.A_log", "pad")
        if rest.startswith("self_attn.") and rest[len("self_attn."):] in _ATTN:
            return Target(block + "attn." + _ATTN[rest[len("self_attn."):]], "copy")
    raise ReleasedFormatError(f"unknown tensor {name!r}: not a tensor of the released K3 layout "
                              f"(docs/released.md lists them).")


def layer_of(name: str) -> int:
    """The layer number in a released tensor name; -1 outside the layers (embedding, head, final norms, vision)."""
    m = _LAYER_RE.fullmatch(name)
    return int(m.group(1)) if m else -1


def mapping(config: K3Config) -> dict[str, Target]:
    """released name -> Target for every language-model tensor of `released_tensors(config)`."""
    return {name: target_of(name) for name in released_tensors(config)}


# ---------------------------------------------------------------------------- the compact table of an index
def template_of(name: str) -> str:
    """A tensor name with its layer and expert numbers replaced by {layer} and {expert}."""
    name = re.sub(r"^language_model\.model\.layers\.\d+\.", "language_model.model.layers.{layer}.", name)
    name = re.sub(r"\.experts\.\d+\.", ".experts.{expert}.", name)
    return re.sub(r"\.blocks\.\d+\.", ".blocks.{block}.", name)


def summarize_index(index: dict, config_json: dict) -> dict:
    """The compact table of a safetensors index: per name template its count, shape, dtype and bytes (the
    index holds names and shards only; shapes and dtypes follow from the released code and the config, see
    `released_tensors` / `vision_tensors`), which shard holds each layer, and the byte total of those shapes
    against the index's own total_size. A name outside the released layout is a ReleasedFormatError."""
    config = K3Config(name="released", **config_fields_from_released(config_json))
    specs = released_tensors(config) | vision_tensors(config_json)
    names = index["weight_map"]
    unknown = sorted(set(names) - set(specs))
    if unknown:
        raise ReleasedFormatError(f"index names {len(unknown)} tensors outside the released layout, "
                                  f"e.g. {unknown[0]!r}.")
    missing = sorted(set(specs) - set(names))
    templates: dict[str, dict] = {}
    for name in names:
        spec = specs[name]
        row = templates.setdefault(template_of(name), {"count": 0, "shape": list(spec.shape), "dtype": spec.dtype,
                                                       "bytes_each": spec_bytes(spec)})
        if row["shape"] != list(spec.shape):
            raise ReleasedFormatError(f"template {template_of(name)!r} has more than one shape.")
        row["count"] += 1
        m = _LAYER_RE.fullmatch(name)
        if m:
            row.setdefault("layers", set()).add(int(m.group(1)))
        e = re.search(r"\.experts\.(\d+)\.", name)
        if e:
            row["experts"] = max(row.get("experts", 0), int(e.group(1)) + 1)
    for row in templates.values():
        if "layers" in row:
            row["layers"] = sorted(row["layers"])
    shards: dict[str, set] = {}
    for name, shard in names.items():
        m = _LAYER_RE.fullmatch(name)
        shards.setdefault(f"layer {m.group(1)}" if m else name.split(".")[0], set()).add(shard)
    computed = sum(spec_bytes(specs[n]) for n in names)
    return {
        "source": f"{SOURCE} reference/model.safetensors.index.json.gz (names and shards); shapes and dtypes from "
                  f"reference/modeling_kimi_linear.py, modeling_kimi_k3.py and config.json (tiny_k3.released)",
        "num_tensors": len(names), "num_shards": len(set(names.values())),
        "total_size": index.get("metadata", {}).get("total_size"), "bytes_from_shapes": computed,
        "missing_from_index": missing,
        "templates": dict(sorted(templates.items())),
        "shards": {k: sorted(v) for k, v in sorted(shards.items())},
    }


def expand_table(table: dict) -> list[str]:
    """Every tensor name a table's templates stand for: each {layer} template over its "layers", each {expert}
    template over its layers and experts 0..experts-1, each {block} template over 0..count-1."""
    names = []
    for template, row in table["templates"].items():
        if "{expert}" in template:
            names.extend(template.format(layer=layer, expert=e) for layer in row["layers"]
                         for e in range(row["experts"]))
        elif "{layer}" in template:
            names.extend(template.format(layer=layer) for layer in row["layers"])
        elif "{block}" in template:
            names.extend(template.format(block=b) for b in range(row["count"]))
        else:
            names.append(template)
    return names


def table_json(table: dict) -> str:
    """A table as JSON text with one line per template and per shard entry (a readable diff)."""
    lines = ["{"]
    for key in ("source", "num_tensors", "num_shards", "total_size", "bytes_from_shapes", "missing_from_index"):
        lines.append(f"  {json.dumps(key)}: {json.dumps(table[key])},")
    for key in ("templates", "shards"):
        rows = [f"    {json.dumps(k)}: {json.dumps(v, separators=(', ', ': '))}" for k, v in table[key].items()]
        lines.append(f"  {json.dumps(key)}: {{\n" + ",\n".join(rows) + "\n  }" + ("," if key == "templates" else ""))
    return "\n".join(lines) + "\n}\n"


def load_k3_table() -> dict:
    """The committed table of the released index (tiny_k3/released/k3_index_table.json)."""
    return json.loads(K3_TABLE.read_text())


def write_k3_table(index_path) -> Path:
    """Regenerate the committed table from the released index (a .json or .json.gz file): the maintainer's path,
    `python -m tiny_k3.released INDEX`."""
    import gzip
    path = Path(index_path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        index = json.load(f)
    table = summarize_index(index, json.loads(RELEASED_CONFIG.read_text()))
    if table["bytes_from_shapes"] != table["total_size"]:
        raise ReleasedFormatError(f"the shapes and dtypes give {table['bytes_from_shapes']:,} bytes, the index says "
                                  f"{table['total_size']:,}: the layout in tiny_k3.released is wrong somewhere.")
    K3_TABLE.write_text(table_json(table))
    return K3_TABLE


# ---------------------------------------------------------------------------- writing a checkpoint (tests, lessons)
def released_state(model) -> dict[str, "torch.Tensor"]:
    """A TinyK3's weights as the released layout stores them (every tensor of `released_tensors`): the inverse of
    the mapping, with each routed expert MXFP4-encoded (tiny_k3.mxfp4.encode) and A_log zero-padded."""
    import torch

    from ..mxfp4 import encode

    config = model.config
    state = model.state_dict()
    out = {}
    encoded: dict[tuple[str, int], tuple] = {}
    for name, spec in released_tensors(config).items():
        target = target_of(name)
        t = state[target.tiny].detach().cpu()
        if target.how in ("packed", "scale"):
            key = (target.tiny, target.expert)
            if key not in encoded:
                encoded[key] = encode(t[target.expert])
            t = encoded[key][0 if target.how == "packed" else 1]
        elif target.how == "row":
            t = t.reshape(1, -1)
        elif target.how == "pad":
            t = torch.cat([t, t.new_zeros(spec.shape[0] - t.shape[0])])
        out[name] = t.to(getattr(torch, ST_DTYPES[spec.dtype])).contiguous()
        if tuple(out[name].shape) != spec.shape:
            raise ReleasedFormatError(f"{name}: made {list(out[name].shape)}, the layout says {list(spec.shape)}.")
    return out


def mxfp4_rounded(model) -> None:
    """Round `model`'s routed experts to MXFP4 in place (decode(encode(w))): the weights a checkpoint written by
    `write_checkpoint` holds, so a TinyK3 and the stream over that checkpoint compute with the same numbers."""
    import torch

    from ..mxfp4 import round_to_mxfp4

    with torch.no_grad():
        for moe in model.moe_layers():
            for w in (moe.w1, moe.w2, moe.w3):
                w.copy_(round_to_mxfp4(w))


def write_checkpoint(model, folder) -> Path:
    """Write `model` (a TinyK3 of K3's layout) as a released-format folder: config.json (`config_json_for`), one
    safetensors shard per layer plus one for the embedding and head (the release keeps a layer in one shard),
    and model.safetensors.index.json with its total_size. For synthetic checkpoints: tests and lessons."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = model.config
    (folder / "config.json").write_text(json.dumps(config_json_for(config), indent=2) + "\n")
    tensors = released_state(model)
    n = config.num_layers + 1
    groups: dict[str, dict] = {}
    for name, t in tensors.items():
        m = _LAYER_RE.fullmatch(name)
        shard = f"model-{(int(m.group(1)) + 1 if m else n):05d}-of-{n:05d}.safetensors"
        groups.setdefault(shard, {})[name] = t
    weight_map = {}
    for shard, group in groups.items():
        save_file(group, str(folder / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, shard))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    return folder
