"""TinyK3: embedding -> layers in K3's schedule -> final depth aggregation -> head.

Each layer is two sublayers, both PreNorm:
    h = AttnRes(sources)  ->  a = KDA or gated MLA (RMSNorm(h))  ->  a joins the sources
    h = AttnRes(sources)  ->  m = dense MLP (layer 0) or latent MoE (RMSNorm(h))  ->  m joins the sources
and before the head one more depth read aggregates everything (attnres.md §2, "Output").
With `residual="standard"` the sources collapse into the usual running sum x += f(x).

`model(tokens, cache)` continues from `cache`: a prompt at once (prefill) or one token at a time
(decode) give the same logits, because KDA carries its state and MLA its latent cache.

`model(tokens, attention_mask=mask)` runs prompts of different lengths as one batch, left-padded: each
row's logits at its real tokens are the ones that prompt gets alone (see `TinyK3.forward`).
"""

from __future__ import annotations

import os
from functools import partial
from typing import NamedTuple

import torch
from torch import nn

from .attnres import DepthAttention, DepthStream
from .cache import ModelCache
from .config import COUNTED_ONLY, ConfigError, K3Config
from .kda import KDALayer
from .mla import GatedMLA
from .moe import GatedMLP, LatentMoE, PlainMoE
from .norm import RMSNorm
from .probe import NO_RECORDER, Recorder, detached
from .weights import CheckpointError, available_pretrained, config_for, load_pretrained


INFERENCE_MODE = True   # without autograd, forward runs in inference mode (see TinyK3.forward); False: plain no_grad


class Padding(NamedTuple):
    """Left padding of one forward call (B rows, T new tokens, S = past + T cached and new).

    mask      [B, T] bool: True at real tokens of this call.
    key_mask  [B, S] bool: True at every real token so far (what MLA may attend to; kept in the cache).
    positions [B, T] long: each token's position counted over real tokens only (0 at a row's first real token).
    """

    mask: torch.Tensor
    key_mask: torch.Tensor
    positions: torch.Tensor


class Block(nn.Module):
    """One transformer layer: an attention sublayer (KDA or MLA) and an MLP sublayer (dense or MoE)."""

    def __init__(self, config: K3Config, index: int, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.index = index
        self.kind = config.layer_kinds[index]
        self.mlp_kind = "dense" if index < config.first_k_dense else "moe"
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.attn = (KDALayer(config, **kw) if self.kind == "kda"
                     else GatedMLA(config, **kw, short_conv=index in config.mla_conv_layers))
        self.short_conv = self.kind == "kda" or index in config.mla_conv_layers
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        moe = PlainMoE if config.moe_kind == "plain" else LatentMoE
        self.mlp = (GatedMLP(config.hidden_size, config.dense_intermediate, config, **kw)
                    if self.mlp_kind == "dense" else moe(config, **kw))
        depth = config.residual != "standard"  # the standard residual reads no depth weights
        self.attn_res = DepthAttention(config.hidden_size, config.rms_norm_eps, **kw) if depth else None
        self.mlp_res = DepthAttention(config.hidden_size, config.rms_norm_eps, **kw) if depth else None

    def forward(self, stream: DepthStream, cache: ModelCache, recorder: Recorder = NO_RECORDER,
                padding: Padding | None = None, hooks=None) -> None:
        i = self.index
        uniform = hooks is not None and i in hooks.uniform_depth
        recording = recorder is not NO_RECORDER  # (the default ignores everything: skip even the detach views)
        h, weights = stream.read(self.attn_res, uniform)
        if recording:
            recorder.record("depth", i, site="attn", weights=_detached(weights), h=detached(h))
        x = self.attn_norm(h)
        extra = {}
        if padding is not None and self.short_conv:
            # A zero input leaves a KDA layer exactly as it was: q, k, v and the conv inputs are 0, so the
            # delta-rule write beta k (v - S'k)^T is 0; the decay only scales S, which is still all zeros
            # before a left-padded row's first real token, and the conv tail stays zeros, as at the start.
            # (In a twin's MLA layer with a short conv the same zeros keep padding out of the conv.)
            x = torch.where(padding.mask[..., None], x, torch.zeros((), dtype=x.dtype, device=x.device))
        if padding is not None and self.kind == "mla":
            extra = dict(positions=padding.positions, key_mask=padding.key_mask)
        out, cache.layers[i] = self.attn(x, cache.layers[i], recorder=recorder, layer=i, hooks=hooks, **extra)
        if recording:
            recorder.record("sublayer", i, site="attn", kind=self.kind, out=detached(out))
        stream.add(out)

        h, weights = stream.read(self.mlp_res, uniform)
        if recording:
            recorder.record("depth", i, site="mlp", weights=_detached(weights), h=detached(h))
        x = self.mlp_norm(h)
        out = self.mlp(x) if self.mlp_kind == "dense" else self.mlp(x, recorder=recorder, layer=i, hooks=hooks)
        if recording:
            recorder.record("sublayer", i, site="mlp", kind=self.mlp_kind, out=detached(out))
        stream.add(out)


def _detached(weights: torch.Tensor | None) -> torch.Tensor | None:
    return None if weights is None else detached(weights)   # (the standard residual reads no depth weights)


def _without_inference_tensors(cache: ModelCache) -> None:
    """Swap, in place, each layer of `cache` that holds inference tensors (made by a forward without autograd)
    for a clone of normal tensors: autograd cannot save inference tensors. The same values; the caller's cache
    object is still the one the forward advances."""
    for i, c in enumerate(cache.layers):
        if any(isinstance(t, torch.Tensor) and t.is_inference() for t in getattr(c, "__dict__", {}).values()):
            cache.layers[i] = c.clone()
    if cache.key_mask is not None and cache.key_mask.is_inference():
        cache.key_mask = cache.key_mask.clone()


def _init_weights(module: nn.Module, std: float) -> None:
    """nanoGPT's one initialisation pass: every nn.Linear and nn.Embedding weight ~ N(0, std).

    std is the config's init_std (K3 / DeepSeek-V3 `initializer_range`). The other parameters start
    where they are declared, once: the router and the stacked experts at N(0, std) (moe.py), KDA's
    A_log and dt_bias as fla does (`KDALayer.reset_gate_parameters`), norm gains at 1, depth queries
    at 0 (attnres.md §3), and the short convolutions at PyTorch's default, as fla's.
    """
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, 0.0, std)


def fresh_init(module: nn.Module, config: K3Config) -> nn.Module:
    """`module` (a part just built, e.g. a KDALayer) given the initialisation TinyK3 gives its parts: a part
    re-initialised in training (train.refresh_kda_mixers) starts as a fresh model's would."""
    module.apply(partial(_init_weights, std=config.init_std))
    return module


class TinyK3(nn.Module):
    def __init__(self, config: K3Config, device=None, dtype=None):
        super().__init__()
        if config.name in COUNTED_ONLY and torch.device(device or "cpu").type != "meta":
            raise ValueError(f"preset {config.name!r} is counted on the meta device only (it has "
                             f"{config.num_layers} layers at width {config.hidden_size}); pick a runnable preset.")
        self.config = config
        dtype = dtype or getattr(torch, config.dtype)
        kw = dict(device=device, dtype=dtype)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size, **kw)
        self.blocks = nn.ModuleList(Block(config, i, **kw) for i in range(config.num_layers))
        self.out_res = (DepthAttention(config.hidden_size, config.rms_norm_eps, **kw)
                        if config.residual != "standard" else None)
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, **kw)
        if self.embed.weight.device.type != "meta":   # meta tensors hold no values: counting needs no init
            self.apply(partial(_init_weights, std=config.init_std))

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def forward(self, tokens: torch.Tensor, cache: ModelCache | None = None,
                recorder: Recorder | None = None,
                attention_mask: torch.Tensor | None = None, hooks=None) -> tuple[torch.Tensor, ModelCache]:
        """tokens [B, T] (long) -> (logits [B, T, vocab], the cache advanced by T tokens).

        attention_mask [B, T] (bool or 0/1): 0 marks padding, which must come first in each row (left
        padding) and only before the row's first real token; later calls may pass all ones or None. Padding
        changes no KDA state or conv tail, is invisible to MLA, and RoPE counts positions over real tokens.
        Logits at padding positions are meaningless; padding still runs through the MLPs (each token on its own)
        and counts in an MoE's `last_load`.
        hooks: a tiny_k3.hooks.Hooks of what-if changes (routing, KDA state and decay, depth weights, MLA
        window) in force for this call; None runs the model as trained.

        Without autograd (under torch.no_grad) the pass runs in torch.inference_mode, so the logits and the
        cache it returns are inference tensors: read them freely, clone one before changing it in place.
        """
        if INFERENCE_MODE and not torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
            # Without autograd the pass runs in inference mode: no version counters or view tracking, a tenth to
            # a sixth less dispatch cost per op, which at decode widths is most of an op's cost. The logits and
            # the cache it returns are inference tensors (read them freely; clone one before changing it in place).
            with torch.inference_mode():
                return self.forward(tokens, cache, recorder, attention_mask, hooks)
        if torch.is_grad_enabled() and cache is not None:
            _without_inference_tensors(cache)   # a cache made without autograd, continued with it
        cfg = self.config
        recorder = NO_RECORDER if recorder is None else recorder
        if tokens.dim() != 2 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must be a non-empty [B, T] tensor of ids, got shape {tuple(tokens.shape)}.")
        if tokens.numel() == 1:
            low = high = int(tokens)
        else:
            low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= cfg.vocab_size:   # (one token, a decode step: one read instead of four ops)
            raise ValueError(f"token ids must lie in [0, {cfg.vocab_size}), got {low}..{high}.")
        cache = cache if cache is not None else ModelCache(cfg.num_layers)
        if cache.position + tokens.shape[1] > cfg.max_seq_len:
            raise ValueError(f"sequence of {cache.position + tokens.shape[1]} tokens is longer than preset "
                             f"{cfg.name!r} allows ({cfg.max_seq_len} tokens).")

        padding = self._padding(attention_mask, tokens, cache)

        x = self.embed(tokens)
        recorder.record("embed", -1, x=detached(x))
        stream = DepthStream(x, cfg.residual, cfg.attnres_block_size)
        for block in self.blocks:
            block(stream, cache, recorder, padding, hooks)
        uniform = hooks is not None and cfg.num_layers in hooks.uniform_depth    # the final read, before the head
        h, weights = stream.read(self.out_res, uniform)
        recorder.record("depth", cfg.num_layers, site="out", weights=_detached(weights), h=detached(h))
        logits = self.lm_head(self.final_norm(h))
        recorder.record("logits", cfg.num_layers, logits=detached(logits))
        cache.position += tokens.shape[1]
        if padding is not None:
            cache.key_mask = padding.key_mask
        return logits, cache

    @staticmethod
    def _padding(attention_mask: torch.Tensor | None, tokens: torch.Tensor, cache: ModelCache) -> Padding | None:
        """Check a left-padding mask against the tokens and the cache; None when nothing is or was padded."""
        if attention_mask is None and cache.key_mask is None:
            return None
        if attention_mask is None:
            attention_mask = torch.ones_like(tokens, dtype=torch.bool)
        if tuple(attention_mask.shape) != tuple(tokens.shape):
            raise ValueError(f"attention_mask must have the shape of tokens {list(tokens.shape)}, "
                             f"got {list(attention_mask.shape)}.")
        mask = attention_mask.to(device=tokens.device).bool()
        past = (cache.key_mask if cache.key_mask is not None
                else mask.new_ones(tokens.shape[0], cache.position))
        if past.shape[0] != tokens.shape[0]:
            raise ValueError(f"attention_mask has {tokens.shape[0]} rows but the cache holds {past.shape[0]}.")
        key_mask = torch.cat([past, mask], 1)
        if bool((key_mask[:, 1:] < key_mask[:, :-1]).any()):
            raise ValueError("attention_mask must be left padding: in each row, zeros may only come before "
                             "the row's first real token (1).")
        if bool(mask.all()) and cache.key_mask is None:
            return None
        positions = (key_mask.long().cumsum(1) - 1).clamp_min(0)[:, -tokens.shape[1]:]
        return Padding(mask, key_mask, positions)

    def moe_layers(self) -> list[LatentMoE]:
        """The MoE modules (latent or plain), in layer order (the training loop updates their selection bias)."""
        return [b.mlp for b in self.blocks if b.mlp_kind == "moe"]

    @classmethod
    def from_pretrained(cls, preset: str, device=None) -> "TinyK3":
        """The shipped trained weights of a preset (tiny_k3/weights/<preset>.safetensors)."""
        return load_pretrained(cls, preset, device=device)


WEIGHTS = ("auto", "trained", "random")


class LoadedModel(NamedTuple):
    model: TinyK3   # in eval mode, on the asked device
    source: str     # "trained" (the shipped checkpoint) or "random" (seeded init)


def load_model(preset: str | K3Config, weights: str = "auto", seed: int = 0, device=None) -> LoadedModel:
    """The one way to build a runnable model (the simulator, the lessons and the CLIs all come here).

    preset: a preset name, a checkpoint name such as "small-twin", or a K3Config.
    weights: "auto" = the shipped trained weights when the config is exactly a shipped checkpoint's, else a
    random init; "trained" = those weights or a CheckpointError; "random" = always the seeded init.
    Random weights are drawn on the CPU from `seed` and then moved, so a seed gives the same weights on
    every device; the caller's global RNG is left as it was. device: as `resolve_device` (None: CPU or
    $TINY_K3_DEVICE).
    """
    config = preset if isinstance(preset, K3Config) else config_for(preset)
    if config.name in COUNTED_ONLY:
        raise ConfigError(f"preset {config.name!r} is a full-size model that is only counted, never run; "
                          f"pick a runnable preset: {', '.join(K3Config.runnable_presets())}.")
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}.")
    shipped = config.name in available_pretrained() and config == config_for(config.name)
    if weights == "trained" and not shipped:
        have = ", ".join(available_pretrained()) or "none"
        raise CheckpointError(f"no trained weights ship for {config.name!r} (presets with weights: {have}); "
                              f"use weights='auto' or 'random'.")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if shipped and weights != "random":
            model, source = TinyK3.from_pretrained(config.name), "trained"
        else:
            model, source = TinyK3(config), "random"
    return LoadedModel(model.to(resolve_device(device)).eval(), source)


def resolve_device(device: str | None = None) -> torch.device:
    """`device`, else $TINY_K3_DEVICE, else CPU; a clear error when CUDA is asked for but absent."""
    name = device or os.environ.get("TINY_K3_DEVICE") or "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; use 'cpu' or 'cuda' (optionally 'cuda:N').") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but no CUDA GPU is available; use 'cpu'.")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r} is not supported; use 'cpu' or 'cuda'.")
    return dev


@torch.no_grad()
def sample_next(logits: torch.Tensor, temperature: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [B, vocab] -> next token [B]: greedy at temperature 0, else softmax sampling.

    What it guarantees: at temperature 0 the argmax of each row (the lowest id among equal maxima), with no
    randomness drawn; above 0 one draw per row from softmax(logits / T) computed in float32, by
    torch.multinomial from `generator` (the global generator when None), so the same generator state on the
    same device and torch version gives the same tokens. It is not the simulator's sampler: sim.session's
    `sample_token` draws in float64 numpy from a seed per (seed, position), so that a run replays on any
    device; for the same seed the two give different tokens. `generate` uses this one.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be 0 (greedy) or positive, got {temperature}.")
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(model: TinyK3, tokens: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
             seed: int = 0) -> torch.Tensor:
    """Prefill `tokens` [B, T], then decode `max_new_tokens` one at a time -> [B, max_new_tokens]."""
    generator = torch.Generator(device=tokens.device).manual_seed(seed)
    logits, cache = model(tokens)
    out = []
    for _ in range(max_new_tokens):
        nxt = sample_next(logits[:, -1], temperature, generator)
        out.append(nxt)
        logits, cache = model(nxt[:, None], cache)
    return torch.stack(out, dim=1) if out else tokens.new_zeros(tokens.shape[0], 0)
