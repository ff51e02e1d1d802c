"""The twin's decode state, restorable to any position of the timeline.

The all-softmax twin's KV cache is cut back to any earlier position (a truncation is its restore). Where the twin
keeps KDA's short convolution in front of its attention (K3Config.mla_conv_layers, docs/recall.md), each such layer
also holds the convolution's last W-1 inputs, a tail that cannot be cut back: it is kept per position here (a few
KB a token), and a restore starts from the nearest kept position and replays the tokens after it. (The same holds
when the twin is the timeline's own model, `--preset small-twin`; a model with KDA layers as well has no kept
states here, and replays from the start.)
"""

from __future__ import annotations

import torch

from tiny_k3.cache import MLACache, ModelCache


class TwinTails:
    """Conv tails of the twin's cache, by the number of tokens seen."""

    def __init__(self, twin_model):
        self.model = twin_model
        self.active = twin_model is not None and bool(twin_model.config.mla_conv_layers)
        self.replay_all = self.active and bool(twin_model.config.kda_layers)   # KDA states cannot be cut back
        self._tails: dict[int, dict[int, torch.Tensor]] = {}   # tokens seen -> {layer: tail [B, W-1, C]}

    def keep(self, cache: ModelCache) -> None:
        """Remember the tails of `cache` at its position (nothing when the twin has no short conv)."""
        if self.active:
            self._tails[cache.position] = {i: c.conv for i, c in enumerate(cache.layers)
                                           if isinstance(c, MLACache) and c.conv is not None}

    def forget_after(self, tokens: int) -> None:
        self._tails = {p: t for p, t in self._tails.items() if p <= tokens}

    def cache_at(self, live: ModelCache, tokens: int, input_ids: list[int]) -> ModelCache:
        """A new twin cache after `tokens` tokens, from the live one (which holds at least that many) and the
        timeline's input ids. The live cache is not changed."""
        base = max((p for p in self._tails if p <= tokens), default=0) if self.active else tokens
        base = 0 if self.replay_all else base
        tails = self._tails.get(base, {})
        cache = ModelCache(len(live.layers))
        cache.layers = [None if c is None or base == 0 else c.truncate(base, tails.get(i))
                        for i, c in enumerate(live.layers)]
        cache.position = base
        if base < tokens:   # replay the recorded tokens: same inputs, same cache
            ids = torch.tensor([input_ids[base:tokens]], device=self.model.device)
            _, cache = self.model(ids, cache)
        return cache
