"""The decode cache: what a model must keep between tokens, with exact byte accounting.

A gated-MLA layer keeps a cache that grows by one row per token: the compressed latent c
(kv_lora_rank values) and the shared key part k_rope (qk_rope_dim values). A KDA layer keeps a
fixed-size recurrent state S [B, H, K, V] (float32) and the last kernel-1 inputs of its short
convolutions. The bytes are read off the live tensors, never from a formula.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def tensor_bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


@dataclass
class KDAState:
    """Fixed-size decode state of one KDA layer.

    state: [B, H, K, V] float32, the delta-rule memory S (key-major).
    conv:  [B, W-1, C] the last W-1 pre-convolution inputs of q, k and v (C = 2*H*K + H*V).
    """

    state: torch.Tensor
    conv: torch.Tensor

    def nbytes(self) -> int:
        return tensor_bytes(self.state) + tensor_bytes(self.conv)

    def clone(self) -> "KDAState":
        return KDAState(self.state.clone(), self.conv.clone())


@dataclass
class MLACache:
    """Growing decode cache of one gated-MLA layer.

    latent: [B, T, kv_lora_rank]  the normalised compressed KV latent c
    k_rope: [B, T, qk_rope_dim]   the key part shared by all heads (NoPE: never rotated)
    conv:   [B, W-1, C] or None   the twin's short-conv tail (K3Config.mla_conv_layers): the last W-1 inputs of
                                  the convolution in front of the attention; fixed size, counted with the states
    """

    latent: torch.Tensor
    k_rope: torch.Tensor
    conv: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.latent.shape[1]

    def kv_nbytes(self) -> int:
        """Bytes that grow with the context: the latent and the shared key part."""
        return tensor_bytes(self.latent) + tensor_bytes(self.k_rope)

    def nbytes(self) -> int:
        return self.kv_nbytes() + tensor_bytes(self.conv)

    def clone(self) -> "MLACache":
        return MLACache(self.latent.clone(), self.k_rope.clone(), None if self.conv is None else self.conv.clone())

    def truncate(self, length: int, conv: torch.Tensor | None = None) -> "MLACache":
        """The cache as it was after `length` tokens: the rows can simply be cut. A short-conv tail cannot be cut
        back (it holds only the last W-1 inputs): pass the tail kept at `length` (sim/session.py keeps them)."""
        if self.conv is not None and conv is None and length != self.length:
            raise ValueError("truncate: this layer has a short-conv tail; pass the tail kept after "
                             f"{length} tokens (it cannot be recovered from the one after {self.length}).")
        tail = self.conv if length == self.length and conv is None else conv
        return MLACache(self.latent[:, :length].clone(), self.k_rope[:, :length].clone(),
                        None if tail is None else tail.clone())


class ModelCache:
    """One entry per layer (KDAState or MLACache, None before the first token) and the position."""

    def __init__(self, num_layers: int):
        self.layers: list[KDAState | MLACache | None] = [None] * num_layers
        self.position = 0  # tokens seen so far
        self.key_mask: torch.Tensor | None = None  # [B, position] bool, False at left padding; None: no padding

    def kv_bytes(self) -> int:
        """Bytes of the growing caches (MLA layers' latents and shared keys)."""
        return sum(c.kv_nbytes() for c in self.layers if isinstance(c, MLACache))

    def state_bytes(self) -> int:
        """Bytes of the fixed-size states: KDA layers' S and convolution tails, and the twin's MLA conv tails."""
        return sum(c.nbytes() if isinstance(c, KDAState) else tensor_bytes(c.conv)
                   for c in self.layers if isinstance(c, (KDAState, MLACache)))

    def layer_bytes(self) -> list[int]:
        return [0 if c is None else c.nbytes() for c in self.layers]

    def nbytes(self) -> int:
        return self.kv_bytes() + self.state_bytes()

    def clone(self) -> "ModelCache":
        other = ModelCache(len(self.layers))
        other.layers = [None if c is None else c.clone() for c in self.layers]
        other.position = self.position
        other.key_mask = None if self.key_mask is None else self.key_mask.clone()
        return other

    def __repr__(self) -> str:
        return f"ModelCache(position={self.position}, kv_bytes={self.kv_bytes()}, state_bytes={self.state_bytes()})"
