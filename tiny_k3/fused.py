"""Inference fast paths that fuse several parameters into one operand, without touching the modules.

At tiny widths a decode step is per-op overhead, not arithmetic (k3-topo: 93 layers, 64 wide), so one
`F.linear(x, cat(W_1, ..., W_n))` and a split beats n projections, and a depthwise conv's three weights
are better concatenated once than on every call. The modules and their state_dict keys stay exactly as
they are: the concatenation is a cache, built on first use and rebuilt whenever a part changes (loading
a checkpoint, an optimiser step, `.to(...)`), keyed on every part's storage pointer, in-place version
counter and dtype. With autograd on, the separate parts run (the reference): training sees no change.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def autograd_needed(tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class CachedCat:
    """cat([owner.<name>.<attr> for name in names], dim), kept between calls. Everything is looked up on the
    owner at every call (a submodule may be swapped, `.to()` replaces the tensors), and a deep copy of the
    owner follows the copy."""

    def __init__(self, owner: nn.Module, names: tuple[str, ...], attr: str = "weight", dim: int = 0):
        self.owner, self.names, self.attr, self.dim = owner, names, attr, dim
        self._key: tuple | None = None
        self._value: torch.Tensor | None = None

    def parts(self) -> list[torch.Tensor]:
        return [getattr(getattr(self.owner, name), self.attr) for name in self.names]

    def __call__(self) -> torch.Tensor:
        parts = self.parts()
        key = tuple((t.data_ptr(), t._version, t.dtype) for t in parts)
        if key != self._key:
            with torch.no_grad():
                self._value = torch.cat(parts, self.dim)
            self._key = key
        return self._value


class FusedLinears:
    """x [..., D] -> one output per group of the owner's Linear layers (named) that read x: group g gives
    cat([x W^T for W in g], -1). A plain object, not an nn.Module: nothing joins state_dict or modules().
    Where a named layer is no longer a bias-free nn.Linear (swapped for something else), the layers run
    one by one, exactly as without the fusion.
    """

    def __init__(self, owner: nn.Module, *groups: tuple[str, ...]):
        self.owner, self.groups = owner, groups
        self.weight = CachedCat(owner, tuple(name for group in groups for name in group))

    def _layers(self) -> list[list[nn.Module]]:
        return [[getattr(self.owner, name) for name in group] for group in self.groups]

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        layers = self._layers()
        flat = [m for group in layers for m in group]
        if (any(not isinstance(m, nn.Linear) or m.bias is not None for m in flat)
                or autograd_needed(m.weight for m in flat)):
            return [torch.cat([m(x) for m in group], -1) if len(group) > 1 else group[0](x) for group in layers]
        sizes = [sum(m.out_features for m in group) for group in layers]
        return list(F.linear(x, self.weight()).split(sizes, -1))
