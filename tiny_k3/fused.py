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
    """cat([m.<name> for m in modules], dim), kept between calls. The tensors are looked up on every call
    (`.to()` or `load_state_dict(assign=True)` replace them), and a deep copy follows the copied modules."""

    def __init__(self, modules: tuple[nn.Module, ...], name: str = "weight", dim: int = 0):
        self.modules, self.name, self.dim = modules, name, dim
        self._key: tuple | None = None
        self._value: torch.Tensor | None = None

    def parts(self) -> list[torch.Tensor]:
        return [getattr(m, self.name) for m in self.modules]

    def __call__(self) -> torch.Tensor:
        parts = self.parts()
        key = tuple((t.data_ptr(), t._version, t.dtype) for t in parts)
        if key != self._key:
            with torch.no_grad():
                self._value = torch.cat(parts, self.dim)
            self._key = key
        return self._value


class FusedLinears:
    """x [..., D] -> one output per group of bias-free Linear layers sharing D: group g gives
    cat([x W^T for W in g], -1). A plain object, not an nn.Module: nothing joins state_dict or modules().
    """

    def __init__(self, *groups: tuple[nn.Linear, ...]):
        linears = [m for group in groups for m in group]
        if not linears or any(not isinstance(m, nn.Linear) or m.bias is not None for m in linears):
            raise ValueError("FusedLinears takes groups of one or more bias-free nn.Linear layers.")
        self.groups = groups
        self.sizes = [sum(m.out_features for m in group) for group in groups]
        self.weight = CachedCat(tuple(linears))

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if autograd_needed(m.weight for group in self.groups for m in group):
            return [torch.cat([m(x) for m in group], -1) if len(group) > 1 else group[0](x) for group in self.groups]
        return list(F.linear(x, self.weight()).split(self.sizes, -1))
