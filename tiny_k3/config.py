"""K3Config: every knob of a Kimi K3-style model in one dataclass, plus named presets.

The released K3 values come from its config.json (see docs/k3_facts.md §1b);
the tiny presets keep K3's shape of things: 56 experts per chosen expert (896:16), the
KDA,KDA,KDA,MLA schedule ending in MLA, a dense first layer, 2 shared experts, latent MoE
and Block Attention Residuals.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import ConfigError  # noqa: F401  (raised here; tiny_k3.config.ConfigError is its public name)
from .released_config import config_fields_from_released

RESIDUALS = ("block", "full", "standard")
MOE_KINDS = ("latent", "plain")      # K3's latent MoE, or DeepSeek-V3 / K2 / Kimi Linear's full-width MoE
MLP_ACTS = ("situ", "swiglu")        # K3's soft-capped SiTU-GLU, or plain SwiGLU (K2, Kimi Linear)
DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
MLA_LATENT_EPS = 1e-6                # eps of MLA's latent RMSNorms as released (K3Config.mla_latent_eps)




def k3_schedule(num_layers: int) -> tuple[str, ...]:
    """K3's layer kinds: every 4th layer (1-based) is gated MLA, and so is the last one.

    K3 (93 layers): MLA at 1-based 4, 8, ..., 92 and 93 -> 69 KDA + 24 MLA (k3_facts.md §1).
    """
    kinds = ["mla" if (i + 1) % 4 == 0 else "kda" for i in range(num_layers)]
    if num_layers:
        kinds[-1] = "mla"
    return tuple(kinds)


@dataclass(frozen=True)
class K3Config:
    name: str = "custom"
    vocab_size: int = 512            # byte tokenizer: 256 bytes + specials; the rest stay unused
    hidden_size: int = 64            # d: width of the residual stream
    num_layers: int = 8              # transformer blocks (each = attention sublayer + MLP sublayer)
    layer_kinds: tuple[str, ...] = ()  # "kda" or "mla" per layer; () means K3's schedule
    first_k_dense: int = 1           # the first k layers use a dense SiTU-GLU MLP instead of MoE
    dense_intermediate: int = 304    # hidden width of that dense MLP
    max_seq_len: int = 4096          # longest sequence (prompt + generated) a preset allows
    rms_norm_eps: float = 1e-5
    dtype: str = "float32"           # weights and the MLA cache; the KDA state is always float32
    init_std: float = 0.02

    # Kimi Delta Attention (kda.md §3)
    kda_heads: int = 2
    kda_head_dim: int = 32           # K = V
    kda_conv_kernel: int = 4         # causal depthwise short convolution on q, k, v
    kda_gate_rank: int = 32          # low-rank decay gate f_a: d -> rank, f_b: rank -> H*K
    kda_gate_lower_bound: float | None = -5.0  # K3: g = lb * sigmoid(...) in (-5, 0); None: -exp(A_log)*softplus
    kda_chunk_size: int = 64         # chunk length of the chunked (WY) form used in prefill
    kda_output_gate_rank: int | None = None  # None: full-rank output gate g_proj (K3); r: g_b(g_a x), d -> r -> H*V
                                             # (Kimi Linear: r = head_dim = 128, docs/lineage.md)

    # Gated MLA with NoPE (k3_facts.md §1c)
    mla_heads: int = 2
    q_lora_rank: int | None = 16     # None: a plain q projection
    kv_lora_rank: int = 16           # the compressed latent c that the cache keeps
    qk_nope_dim: int = 16
    qk_rope_dim: int = 8             # shared key part; cached; not rotated (NoPE) unless mla_rope
    v_head_dim: int = 16
    mla_output_gate: bool = True     # out = W_o(attn * sigmoid(W_g x)) (K3); False: W_o(attn) (K2, Kimi Linear)
    mla_rope: bool = False           # True: rotate the qk_rope_dim channels of q and the shared key (K2, DeepSeek-V3)
    rope_theta: float = 10000.0      # RoPE base, used only when mla_rope (K2: 50,000)
    mla_conv_layers: tuple[int, ...] = ()  # MLA layers that keep KDA's short conv (width kda_conv_kernel) in front
                                           # of their attention: the twin's, where the hybrid has KDA (twin())
    mla_norm_eps: float | None = None  # eps of the q/kv latent RMSNorms; None: 1e-6, as released (see mla_latent_eps)

    # Latent MoE (k3_facts.md §1c, §2)
    moe_kind: str = "latent"         # "latent" (K3) or "plain": experts at full width, no down/up/norm (K2)
    num_experts: int = 896
    top_k: int = 16
    moe_intermediate: int = 8        # hidden width of one routed expert
    latent_dim: int = 32             # experts run at this width (K3: 7168 -> 3584)
    num_shared_experts: int = 2
    shared_intermediate: int = 16    # hidden width of each shared expert (run at full width)
    routed_scaling: float = 1.0      # K3: 1.0
    renormalize: bool = True
    mlp_act: str = "situ"            # every GLU (dense, shared, routed): "situ" (K3) or "swiglu" (K2, Kimi Linear)
    situ_beta_gate: float = 4.0      # SiTU-GLU soft caps
    situ_beta_up: float = 25.0
    bias_update_rate: float = 1e-3   # gamma of the aux-loss-free selection-bias update

    # Attention Residuals (attnres.md)
    residual: str = "block"          # "block", "full" or "standard" (the plain PreNorm residual)
    attnres_block_size: int = 12     # sublayers per AttnRes block (the paper's unit; K3: 12 layers = 24)

    def __post_init__(self):
        if not self.layer_kinds:
            object.__setattr__(self, "layer_kinds", k3_schedule(self.num_layers))
        object.__setattr__(self, "layer_kinds", tuple(self.layer_kinds))
        object.__setattr__(self, "mla_conv_layers", tuple(self.mla_conv_layers))   # (JSON gives lists)
        self.validate()

    # ------------------------------------------------------------------ derived sizes
    @property
    def kda_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_kinds) if kind == "kda"]

    @property
    def mla_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_kinds) if kind == "mla"]

    @property
    def moe_layers(self) -> list[int]:
        return list(range(self.first_k_dense, self.num_layers))

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_dim + self.qk_rope_dim

    @property
    def mla_latent_eps(self) -> float:
        """eps of MLA's q and kv latent RMSNorms: `mla_norm_eps`, or MLA_LATENT_EPS (1e-6) when it is None.

        The released code builds both norms without an eps, so they take KimiRMSNorm's default, 1e-6, while
        every other norm gets rms_norm_eps (1e-5): PipeNetwork/kimi-k3-mlx@fe0738f reference/modeling_kimi_linear.py
        line 227 (`def __init__(self, hidden_size, eps=1e-6)`), line 368 (`KimiRMSNorm(self.q_lora_rank)`) and
        line 383 (`KimiRMSNorm(self.kv_lora_rank)`). DeepSeek-V3 / K2 build theirs the same way. None (every K3
        preset, and what the shipped checkpoints' stored configs say) therefore means 1e-6; an explicit value wins.
        """
        return MLA_LATENT_EPS if self.mla_norm_eps is None else self.mla_norm_eps

    @property
    def mla_cache_width(self) -> int:
        """Values cached per token per MLA layer: the latent c and the shared key part."""
        return self.kv_lora_rank + self.qk_rope_dim

    @property
    def dtype_bytes(self) -> int:
        return DTYPES[self.dtype]

    @property
    def num_sublayers(self) -> int:
        return 2 * self.num_layers

    def twin(self, short_conv: bool = True) -> "K3Config":
        """The all-softmax twin: the same model with every attention layer as gated MLA.

        Its MLA layers rotate their qk_rope_dim channels (mla_rope, as K2 and DeepSeek-V3 do): K3's MLA can
        be NoPE because its KDA layers carry word order, and a model with no KDA layer has no other source
        of it. The cache is the same either way (the rope channels are cached already).

        short_conv (the default): every layer that is KDA here keeps KDA's causal depthwise short convolution
        in front of its attention (`mla_conv_layers`), so the hybrid and its twin differ only in how they
        remember, a fixed state against a growing cache. Why: looking up `q=8;` needs the key one byte back at
        the query and two bytes back at the value; a short conv hands a layer both for free, while a
        softmax-only model must grow previous-token heads first, which took it far longer than a laptop's
        training budget (docs/recall.md). Its decode tail is a constant number of bytes, counted with the state.
        short_conv=False gives the twin without it, as it shipped before.
        """
        kinds = ("mla",) * self.num_layers
        return dataclasses.replace(self, name=f"{self.name}-twin", layer_kinds=kinds, mla_rope=True,
                                   mla_conv_layers=tuple(self.kda_layers) if short_conv else ())

    def replace(self, **changes) -> "K3Config":
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        def need(ok: bool, message: str):
            if not ok:
                raise ConfigError(message)

        positive = ["vocab_size", "hidden_size", "num_layers", "dense_intermediate", "max_seq_len",
                    "kda_heads", "kda_head_dim", "kda_conv_kernel", "kda_gate_rank", "kda_chunk_size",
                    "mla_heads", "kv_lora_rank", "qk_nope_dim", "v_head_dim", "num_experts", "top_k",
                    "moe_intermediate", "latent_dim", "shared_intermediate", "attnres_block_size"]
        for name in positive:
            need(getattr(self, name) >= 1, f"{name} must be a positive integer, got {getattr(self, name)}.")
        need(self.vocab_size >= 258, f"vocab_size must be at least 258 (256 bytes + BOS + EOS), got {self.vocab_size}.")
        need(self.top_k <= self.num_experts,
             f"top_k ({self.top_k}) cannot be larger than num_experts ({self.num_experts}).")
        need(self.qk_rope_dim >= 0, f"qk_rope_dim must be 0 or more, got {self.qk_rope_dim}.")
        need(self.q_lora_rank is None or self.q_lora_rank >= 1,
             f"q_lora_rank must be None or a positive integer, got {self.q_lora_rank}.")
        need(self.num_shared_experts >= 0, f"num_shared_experts must be 0 or more, got {self.num_shared_experts}.")
        need(len(self.layer_kinds) == self.num_layers,
             f"layer_kinds has {len(self.layer_kinds)} entries but num_layers is {self.num_layers}.")
        bad = sorted({k for k in self.layer_kinds if k not in ("kda", "mla")})
        need(not bad, f"layer_kinds may only contain 'kda' and 'mla', got {bad}.")
        need(self.layer_kinds[-1] == "mla" or self.name in ALL_KDA_ABLATIONS,
             "the layer schedule must end with an MLA layer (K3's last layer is gated MLA).")
        need(0 <= self.first_k_dense <= self.num_layers,
             f"first_k_dense must be between 0 and num_layers ({self.num_layers}), got {self.first_k_dense}.")
        need(self.residual in RESIDUALS, f"residual must be one of {', '.join(RESIDUALS)}; got {self.residual!r}.")
        need(self.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}.")
        need(self.kda_gate_lower_bound is None or self.kda_gate_lower_bound < 0,
             f"kda_gate_lower_bound must be negative or None, got {self.kda_gate_lower_bound}.")
        need(self.rms_norm_eps > 0, f"rms_norm_eps must be positive, got {self.rms_norm_eps}.")
        need(self.moe_kind in MOE_KINDS, f"moe_kind must be one of {', '.join(MOE_KINDS)}; got {self.moe_kind!r}.")
        need(self.mlp_act in MLP_ACTS, f"mlp_act must be one of {', '.join(MLP_ACTS)}; got {self.mlp_act!r}.")
        need(self.kda_output_gate_rank is None or self.kda_output_gate_rank >= 1,
             f"kda_output_gate_rank must be None (full rank) or a positive integer, got {self.kda_output_gate_rank}.")
        need(self.mla_norm_eps is None or self.mla_norm_eps > 0,
             f"mla_norm_eps must be None (use rms_norm_eps) or positive, got {self.mla_norm_eps}.")
        need(self.rope_theta > 0, f"rope_theta must be positive, got {self.rope_theta}.")
        bad_conv = [i for i in self.mla_conv_layers if not (0 <= i < self.num_layers and self.layer_kinds[i] == "mla")]
        need(not bad_conv, f"mla_conv_layers may only name MLA layers (0-based), got {bad_conv}; "
                           f"the MLA layers are {self.mla_layers}.")
        need(not self.mla_rope or (self.qk_rope_dim > 0 and self.qk_rope_dim % 2 == 0),
             f"mla_rope rotates channel pairs, so qk_rope_dim must be a positive even number, got {self.qk_rope_dim}.")

    # ------------------------------------------------------------------ presets
    @staticmethod
    def presets() -> list[str]:
        return list(_PRESETS)

    @staticmethod
    def runnable_presets() -> list[str]:
        """The presets small enough to build with real weights: all but the full-size ones, which are
        only ever built on the meta device (counted, never run)."""
        return [name for name in _PRESETS if name not in COUNTED_ONLY]

    @staticmethod
    def from_released(path, name: str | None = None) -> "K3Config":
        """The K3Config of a released-format config.json (its `text_config`): the released K3's file gives
        exactly the `k3` preset (tests/test_released.py, on the copy in tiny_k3/released/config.json).

        Fields read: hidden_size, num_hidden_layers, linear_attn_config (kda_layers / full_attn_layers, 1-based;
        num_heads, head_dim, short_conv_kernel_size, gate_lower_bound, use_full_rank_gate), first_k_dense_replace,
        intermediate_size, max_position_embeddings, rms_norm_eps, dtype, initializer_range, num_attention_heads,
        q_lora_rank, kv_lora_rank, qk_nope/rope_head_dim, v_head_dim, mla_use_output_gate, mla_use_nope,
        num_experts, num_experts_per_token, moe_intermediate_size, routed_expert_hidden_size, num_shared_experts,
        routed_scaling_factor, moe_renormalize, hidden_act, activation_situ_(linear_)beta, attn_res_block_size,
        vocab_size. Where the released code differs from the field's plain reading (PipeNetwork/kimi-k3-mlx
        @fe0738f, reference/modeling_kimi_linear.py):
          - the KDA decay gate's rank is head_dim: `f_a_proj = nn.Linear(hidden_size, head_dim)` (line 523);
          - each shared expert is moe_intermediate_size wide (`moe_intermediate_size * num_shared_experts`, line 798);
          - attn_res_block_size counts layers (`layer_idx % attn_res_block_size == 0`, line 995); tiny-k3 counts
            sublayers, so 12 layers -> attnres_block_size 24;
          - the MLA latent norms keep eps 1e-6 (lines 368, 383): mla_norm_eps None, see `mla_latent_eps`;
          - a lone routed expert is not renormalised (line 753; tiny_k3/moe.py `route`).
        Initialisation is not read (a checkpoint brings its weights): tiny-k3 starts A_log at 0 under the
        lower-bound gate (fla's convention) where the released code draws log U(1, 16) (line 520), and the depth
        queries at 0 where the released code builds `nn.Linear(hidden_size, 1)` (line 914): with zero queries
        every depth read starts as the mean of its sources, i.e. as the standard residual (the AttnRes paper's
        zero init; tiny_k3/attnres.py, DepthAttention).
        Fields tiny-k3 does not model must hold K3's value (grouped routing, softmax router, an MoE only every
        n-th layer, GQA, tied embeddings, MTP layers); any other value is a ConfigError naming the field.
        name: the config's name; None gives "k3" when the result is the k3 preset, else "released".
        """
        fields = config_fields_from_released(path)
        config = K3Config(name="released", **fields)
        if name is None:
            name = "k3" if dataclasses.replace(config, name="k3") == _PRESETS["k3"] else "released"
        return dataclasses.replace(config, name=name)

    @staticmethod
    def preset(name: str, **overrides) -> "K3Config":
        """A named preset, optionally with some fields changed: `K3Config.preset("tiny", top_k=4)`."""
        if name not in _PRESETS:
            raise ConfigError(f"unknown preset {name!r}; valid presets are: {', '.join(_PRESETS)}.")
        base = _PRESETS[name]
        return dataclasses.replace(base, **overrides) if overrides else base


# Presets allowed past the "ends in MLA" rule: the all-KDA ablation exists to show what a fixed-size
# state forgets (recall vs number of pairs) when no layer keeps a cache that grows with the context.
# The small presets start their weights at N(0, 0.07), not 0.02: 0.02 is GPT-2's std at width 768; at width 64
# and latents of 16-32 it leaves attention logits ~0.01 at init (q, k entries ~0.1), uniform attention and
# gradients too small to leave it (measured: a twin at 0.02 did not recall 2 pairs after 200 recall-only
# steps, 15 %; at 0.07 it reached 38 %). 0.07 ~ 0.02 * sqrt(768 / 64) keeps GPT-2's per-unit scale.
SMALL_INIT_STD = 0.07
ALL_KDA_ABLATIONS = ("small-kda",)

DEFAULT_PRESET = "small"
DEFAULT_PROMPT = "b=5; z=1; a red box. | z="   # a recall query the shipped small answers (tests/test_default_prompt.py)

# K3's lineage in the same config language (docs/lineage.md): the documented exception to "every preset keeps
# 56:1, K3's schedule, 2 shared experts, latent MoE, SiTU-GLU and Block AttnRes" -- each keeps its own family's
# shape instead (Kimi Linear 32:1, K2 48:1; 1 shared expert, plain MoE, SwiGLU, the standard residual).
LINEAGE_PRESETS = ("kimi-linear-48b", "kimi-linear-tiny", "k2", "k2-tiny")
# Full-size presets: built on the meta device to be counted, never run (K3 and its lineage at full size).
COUNTED_ONLY = frozenset({"k3", "kimi-linear-48b", "k2"})


def _mini(experts: int, top_k: int) -> K3Config:
    """k3_facts.md §7 family A: iso-parameter and iso-FLOP, m = 256/k, granularity grows with N."""
    return K3Config(
        name=f"mini-{experts}/{top_k}", vocab_size=512, hidden_size=128, num_layers=8,
        dense_intermediate=608, kda_heads=4, kda_head_dim=32, kda_gate_rank=32,
        mla_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_dim=16, qk_rope_dim=8, v_head_dim=16,
        num_experts=experts, top_k=top_k, moe_intermediate=256 // top_k, latent_dim=64,
        shared_intermediate=128, attnres_block_size=2,
    )


_PRESETS: dict[str, K3Config] = {
    # The released K3 (k3_facts.md §1b). Never materialised: built on the meta device only.
    "k3": K3Config(
        name="k3", vocab_size=163840, hidden_size=7168, num_layers=93, dense_intermediate=33792,
        max_seq_len=1_048_576, dtype="bfloat16",
        kda_heads=96, kda_head_dim=128, kda_gate_rank=128, kda_gate_lower_bound=-5.0,
        mla_heads=96, q_lora_rank=1536, kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128,
        num_experts=896, top_k=16, moe_intermediate=3072, latent_dim=3584,
        num_shared_experts=2, shared_intermediate=3072, routed_scaling=1.0,
        # config.json says attn_res_block_size 12; K3's code closes a block at *layers* 0, 12, ..., 84
        # (k3_facts.md §1c), i.e. every 12 transformer layers = 24 sublayers, the unit counted here.
        attnres_block_size=24,
    ),
    # K3's exact topology (93 layers, 69 KDA + 24 MLA, 896 experts, top-16) at tiny widths (§7).
    "k3-topo": K3Config(
        name="k3-topo", vocab_size=512, hidden_size=64, num_layers=93, dense_intermediate=304,
        kda_heads=2, kda_head_dim=32, kda_gate_rank=32,
        mla_heads=2, q_lora_rank=16, kv_lora_rank=16, qk_nope_dim=16, qk_rope_dim=8, v_head_dim=16,
        num_experts=896, top_k=16, moe_intermediate=8, latent_dim=32, shared_intermediate=16,
        attnres_block_size=24,  # as k3: a block every 12 layers, [embedding, 7 block sums, partial]
    ),
    **{f"mini-{n}/{k}": _mini(n, k) for n, k in [(56, 1), (112, 2), (224, 4), (448, 8), (896, 16)]},
    # The TUI's and lessons' default: 8 layers, the full 896-expert grid, quick on a laptop.
    "small": K3Config(
        name="small", vocab_size=512, hidden_size=64, num_layers=8, dense_intermediate=256,
        max_seq_len=2048, kda_heads=2, kda_head_dim=32, kda_gate_rank=32,
        mla_heads=2, q_lora_rank=32, kv_lora_rank=16, qk_nope_dim=16, qk_rope_dim=8, v_head_dim=16,
        num_experts=896, top_k=16, moe_intermediate=8, latent_dim=16, shared_intermediate=32,
        attnres_block_size=4,  # 3.2M parameters: the hybrid and its twin ship in bfloat16 in 12.6 MB
        init_std=SMALL_INIT_STD,
    ),
    # The all-KDA ablation of `small` (same widths, every attention layer KDA): see ALL_KDA_ABLATIONS.
    "small-kda": K3Config(
        name="small-kda", vocab_size=512, hidden_size=64, num_layers=8, dense_intermediate=256,
        max_seq_len=2048, kda_heads=2, kda_head_dim=32, kda_gate_rank=32, layer_kinds=("kda",) * 8,
        mla_heads=2, q_lora_rank=32, kv_lora_rank=16, qk_nope_dim=16, qk_rope_dim=8, v_head_dim=16,
        num_experts=896, top_k=16, moe_intermediate=8, latent_dim=16, shared_intermediate=32,
        attnres_block_size=4, init_std=SMALL_INIT_STD,
    ),
    # The tests' preset: one KDA,KDA,KDA,MLA cycle, 112 experts top-2 (still 56:1).
    "tiny": K3Config(
        name="tiny", vocab_size=512, hidden_size=32, num_layers=4, dense_intermediate=64,
        max_seq_len=512, kda_heads=2, kda_head_dim=8, kda_gate_rank=8, kda_chunk_size=16,
        mla_heads=2, q_lora_rank=16, kv_lora_rank=8, qk_nope_dim=8, qk_rope_dim=4, v_head_dim=8,
        num_experts=112, top_k=2, moe_intermediate=8, latent_dim=16, shared_intermediate=16,
        attnres_block_size=2,
    ),
    # Kimi Linear 48B-A3B (arXiv:2510.26692; HF config.json and modeling_kimi.py, docs/lineage.md), meta only.
    # Its MLA schedule 4, 8, ..., 24, 27 is K3's rule (every 4th layer and the last) on 27 layers.
    "kimi-linear-48b": K3Config(
        name="kimi-linear-48b", vocab_size=163840, hidden_size=2304, num_layers=27, dense_intermediate=9216,
        max_seq_len=1_048_576, dtype="bfloat16", rms_norm_eps=1e-5, residual="standard",
        layer_kinds=tuple("mla" if i + 1 in (4, 8, 12, 16, 20, 24, 27) else "kda" for i in range(27)),
        kda_heads=32, kda_head_dim=128, kda_gate_rank=128, kda_gate_lower_bound=None, kda_output_gate_rank=128,
        mla_heads=32, q_lora_rank=None, kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128,
        mla_output_gate=False, mla_norm_eps=1e-6,   # KimiRMSNorm(kv_lora_rank) keeps its default eps 1e-6
        moe_kind="plain", mlp_act="swiglu", num_experts=256, top_k=8, moe_intermediate=1024,
        num_shared_experts=1, shared_intermediate=1024, routed_scaling=2.446,
    ),
    # Kimi K2 (DeepSeek-V3's architecture at K2's values: HF config.json, docs/lineage.md), meta only.
    "k2": K3Config(
        name="k2", vocab_size=163840, hidden_size=7168, num_layers=61, dense_intermediate=18432,
        max_seq_len=131072, dtype="bfloat16", rms_norm_eps=1e-6, residual="standard", layer_kinds=("mla",) * 61,
        mla_heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128,
        mla_output_gate=False, mla_rope=True, rope_theta=50000.0,  # (YaRN context extension not modelled)
        moe_kind="plain", mlp_act="swiglu", num_experts=384, top_k=8, moe_intermediate=2048,
        num_shared_experts=1, shared_intermediate=2048, routed_scaling=2.827,
    ),
    # Runnable Kimi Linear: its shape (KDA x3 + NoPE MLA without gate, low-rank output gate, unbounded decay
    # gate, 32:1 plain MoE with 1 shared expert, SwiGLU, standard residual) at tiny widths.
    "kimi-linear-tiny": K3Config(
        name="kimi-linear-tiny", vocab_size=512, hidden_size=64, num_layers=8, dense_intermediate=256,
        max_seq_len=2048, residual="standard",
        kda_heads=2, kda_head_dim=32, kda_gate_rank=32, kda_gate_lower_bound=None, kda_output_gate_rank=32,
        mla_heads=2, q_lora_rank=None, kv_lora_rank=16, qk_nope_dim=16, qk_rope_dim=8, v_head_dim=16,
        mla_output_gate=False, mla_norm_eps=1e-6,
        moe_kind="plain", mlp_act="swiglu", num_experts=256, top_k=8, moe_intermediate=8,
        num_shared_experts=1, shared_intermediate=8, routed_scaling=2.446,
    ),
    # Runnable K2: all layers MLA with RoPE and no gate, 48:1 plain MoE with 1 shared expert, SwiGLU.
    "k2-tiny": K3Config(
        name="k2-tiny", vocab_size=512, hidden_size=64, num_layers=8, dense_intermediate=160,
        max_seq_len=2048, rms_norm_eps=1e-6, residual="standard", layer_kinds=("mla",) * 8,
        mla_heads=2, q_lora_rank=32, kv_lora_rank=16, qk_nope_dim=16, qk_rope_dim=8, v_head_dim=16,
        mla_output_gate=False, mla_rope=True, rope_theta=50000.0,
        moe_kind="plain", mlp_act="swiglu", num_experts=384, top_k=8, moe_intermediate=8,
        num_shared_experts=1, shared_intermediate=8, routed_scaling=2.827,
    ),
}
