"""TinyK3: embedding -> layers in K3's schedule -> final depth aggregation -> head.

Each layer is two sublayers, both PreNorm:
    h = AttnRes(sources)  ->  a = KDA or gated MLA (RMSNorm(h))  ->  a joins the sources
    h = AttnRes(sources)  ->  m = dense MLP (layer 0) or latent MoE (RMSNorm(h))  ->  m joins the sources
and before the head one more depth read aggregates everything (attnres.md §2, "Output").
With `residual="standard"` the sources collapse into the usual running sum x += f(x).

`model(tokens, cache)` continues from `cache`: a prompt at once (prefill) or one token at a time
(decode) give the same logits, because KDA carries its state and MLA its latent cache.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from .attnres import DepthAttention, DepthStream
from .cache import ModelCache
from .config import K3Config
from .kda import KDALayer
from .mla import GatedMLA
from .moe import GatedMLP, LatentMoE
from .norm import RMSNorm


class Block(nn.Module):
    """One transformer layer: an attention sublayer (KDA or MLA) and an MLP sublayer (dense or MoE)."""

    def __init__(self, config: K3Config, index: int, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.index = index
        self.kind = config.layer_kinds[index]
        self.mlp_kind = "dense" if index < config.first_k_dense else "moe"
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.attn = KDALayer(config, **kw) if self.kind == "kda" else GatedMLA(config, **kw)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.mlp = (GatedMLP(config.hidden_size, config.dense_intermediate, config, **kw)
                    if self.mlp_kind == "dense" else LatentMoE(config, **kw))
        if config.residual != "standard":
            self.attn_res = DepthAttention(config.hidden_size, config.rms_norm_eps, **kw)
            self.mlp_res = DepthAttention(config.hidden_size, config.rms_norm_eps, **kw)

    def forward(self, stream: DepthStream, cache: ModelCache, recorder=None) -> None:
        i = self.index
        h, weights = stream.read(getattr(self, "attn_res", None))
        if recorder is not None:
            recorder.record("depth", i, site="attn", weights=weights, h=h.detach())
        out, cache.layers[i] = self.attn(self.attn_norm(h), cache.layers[i], recorder=recorder, layer=i)
        if recorder is not None:
            recorder.record("sublayer", i, site="attn", kind=self.kind, out=out.detach())
        stream.add(out)

        h, weights = stream.read(getattr(self, "mlp_res", None))
        if recorder is not None:
            recorder.record("depth", i, site="mlp", weights=weights, h=h.detach())
        x = self.mlp_norm(h)
        out = self.mlp(x) if self.mlp_kind == "dense" else self.mlp(x, recorder=recorder, layer=i)
        if recorder is not None:
            recorder.record("sublayer", i, site="mlp", kind=self.mlp_kind, out=out.detach())
        stream.add(out)


class TinyK3(nn.Module):
    def __init__(self, config: K3Config, device=None, dtype=None):
        super().__init__()
        self.config = config
        dtype = dtype or getattr(torch, config.dtype)
        kw = dict(device=device, dtype=dtype)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size, **kw)
        self.blocks = nn.ModuleList(Block(config, i, **kw) for i in range(config.num_layers))
        if config.residual != "standard":
            self.out_res = DepthAttention(config.hidden_size, config.rms_norm_eps, **kw)
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, **kw)
        if torch.device(device or "cpu").type != "meta":
            self._init_linear_weights()

    def _init_linear_weights(self) -> None:
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def forward(self, tokens: torch.Tensor, cache: ModelCache | None = None,
                recorder=None) -> tuple[torch.Tensor, ModelCache]:
        """tokens [B, T] (long) -> (logits [B, T, vocab], the cache advanced by T tokens)."""
        cfg = self.config
        if tokens.dim() != 2 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must be a non-empty [B, T] tensor of ids, got shape {tuple(tokens.shape)}.")
        if int(tokens.min()) < 0 or int(tokens.max()) >= cfg.vocab_size:
            raise ValueError(f"token ids must lie in [0, {cfg.vocab_size}), got {int(tokens.min())}..{int(tokens.max())}.")
        cache = cache if cache is not None else ModelCache(cfg.num_layers)
        if cache.position + tokens.shape[1] > cfg.max_seq_len:
            raise ValueError(f"sequence of {cache.position + tokens.shape[1]} tokens is longer than preset "
                             f"{cfg.name!r} allows ({cfg.max_seq_len} tokens).")

        x = self.embed(tokens)
        if recorder is not None:
            recorder.record("embed", -1, x=x.detach())
        stream = DepthStream(x, cfg.residual, cfg.attnres_block_size)
        for block in self.blocks:
            block(stream, cache, recorder)
        h, weights = stream.read(getattr(self, "out_res", None))
        if recorder is not None:
            recorder.record("depth", cfg.num_layers, site="out", weights=weights, h=h.detach())
        logits = self.lm_head(self.final_norm(h))
        if recorder is not None:
            recorder.record("logits", cfg.num_layers, logits=logits.detach())
        cache.position += tokens.shape[1]
        return logits, cache

    def moe_layers(self) -> list[LatentMoE]:
        """The latent-MoE modules, in layer order (the training loop updates their selection bias)."""
        return [b.mlp for b in self.blocks if b.mlp_kind == "moe"]

    @classmethod
    def from_pretrained(cls, preset: str, device=None) -> "TinyK3":
        """The shipped trained weights of a preset (tiny_k3/weights/<preset>.safetensors)."""
        from .weights import load_pretrained

        return load_pretrained(cls, preset, device=device)


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
    """logits [B, vocab] -> next token [B]: greedy at temperature 0, else softmax sampling."""
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
