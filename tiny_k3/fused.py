"""Inference fast paths that fuse several parameters into one operand, without touching the modules.

At tiny widths a decode step is per-op overhead, not arithmetic (k3-topo: 93 layers, 64 wide), so one
`F.linear(x, cat(W_1, ..., W_n))` and a split beats n projections, and a depthwise conv's three weights
are better concatenated once than on every call. The modules and their state_dict keys stay exactly as
they are: the concatenation is a cache, built on first use and rebuilt whenever a part changes (loading
a checkpoint, an optimiser step, `.to(...)`), keyed on every part's storage pointer, in-place version
counter and dtype. With autograd on, the separate parts run (the reference): training sees no change.
Also here, for the same fast paths: cached scalar constants, per-thread scratch buffers and sampled
products (SDDMM, for the MoE's chosen experts: tiny_k3/moe_fast.py).
"""

from __future__ import annotations

import functools
import math
import threading
import warnings

import torch
import torch.nn.functional as F
from torch import nn


def constant(value: float, like: torch.Tensor) -> torch.Tensor:
    """`value` as a 0-dim tensor of like's dtype and device, made once: in an op with `like` the same number as
    the Python float (torch casts a Python scalar to the tensor's dtype too), without wrapping it into a tensor
    on every call, which costs a scalar op on the CPU three to four times its dispatch (~4.5 us against ~1)."""
    return _constant_of(value, like.dtype, like.device)


@functools.lru_cache(maxsize=None)
def _constant_of(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False):   # a normal tensor, usable in and out of inference mode
        return torch.tensor(value, dtype=dtype, device=device)


_SCRATCH = threading.local()


def scratch_buffer(slot: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """An uninitialised buffer [shape] of like's dtype and device for a temporary that never leaves the call,
    the same memory on every call (and layer: they run one after another) of this thread that asks for `slot`,
    grown when a call needs more. Callers name their slots apart ("kda ...").

    Why: at prefill the fast paths' temporaries are megabytes, which glibc's malloc serves from fresh pages
    (mmap, or a heap it trimmed after the last call): a page fault per 4 KB (~3 us on a VM), which cost more
    than the arithmetic. Per thread, so two simulations in two threads never share one.
    """
    pool = _SCRATCH.__dict__.setdefault("pool", {})
    key, numel = (slot, like.dtype, like.device), math.prod(shape)
    buffer = pool.get(key)
    if buffer is None or buffer.numel() < numel:
        with torch.inference_mode(False):  # a normal tensor: writable in place inside and outside inference mode
            buffer = pool[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buffer[:numel].view(shape)


# glibc's mallopt parameters (malloc.h): M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 32 << 20        # the largest glibc accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)


@functools.lru_cache(maxsize=None)
def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep the memory a process frees for its next allocations, instead of handing it back to
    the system: blocks under 32 MB come from the heap (not a fresh mmap each), and the heap is never trimmed.

    Why: a training step allocates and frees hundreds of megabytes of temporaries (the router's [N, 896] scores
    alone are 11 MB a layer), and a fresh page costs a page fault, ~3 us per 4 KB on a VM. On an idle machine that
    is about 1 % of a step of `small` (bench/results/bench_train.txt); more while another job shares the machine.
    The price: the process keeps its peak memory. `train.train_step` calls it (the first call sets it, the rest are
    a cached no-op); returns whether it took effect (False off glibc, where it does nothing)."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                                                               (_M_TRIM_THRESHOLD, 2**31 - 1),
                                                               (_M_TOP_PAD, 64 << 20)))


def autograd_needed(tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class CachedWeights:
    """build(*[owner.<name>.<attr> for name in names]), kept between calls. A name may be a dotted path
    ("shared.w1"); with attr None it names the tensor itself (owner.<name>). Everything is looked up on the
    owner at every call (a submodule may be swapped, `.to()` replaces the tensors), and a deep copy of the
    owner follows the copy. Parts that are inference tensors
    (made under torch.inference_mode) have no version counter, so for them nothing is kept: built every call.
    """

    def __init__(self, owner: nn.Module, names: tuple[str, ...], build, attr: str | None = "weight"):
        self.owner, self.names, self.build, self.attr = owner, names, build, attr
        self._paths = tuple(tuple(name.split(".")) for name in names)
        self._key: tuple | None = None
        self._value: torch.Tensor | None = None

    def parts(self) -> list[torch.Tensor]:
        # The modules' own dicts first (nn.Module.__getattr__ is the slow way to the same objects at decode).
        # attr None: each name ends in the tensor's own name ("query": the owner's parameter `query`).
        found = []
        for path in self._paths:
            module, attr = self.owner, self.attr
            if attr is None:
                path, attr = path[:-1], path[-1]
            for name in path:
                child = module._modules.get(name)
                module = getattr(module, name) if child is None else child
            tensor = module._parameters.get(attr)
            found.append(getattr(module, attr) if tensor is None else tensor)
        return found

    def __call__(self, parts: list[torch.Tensor] | None = None) -> torch.Tensor:
        """The kept value; parts: `self.parts()` where the caller has looked them up already."""
        parts = self.parts() if parts is None else parts
        try:
            key = [(t.data_ptr(), t._version, t.dtype) for t in parts]
        except RuntimeError:   # an inference tensor has no version counter: nothing can be kept
            self._key = None
            with torch.no_grad():
                return self.build(*parts)
        if key != self._key:
            # A normal tensor even when first built in inference mode (a forward without autograd runs in it):
            # autograd may use the kept value later (frozen weights, an input that requires grad).
            with torch.inference_mode(False), torch.no_grad():   # (this order: inference_mode(False) turns grad on)
                self._value = self.build(*parts)
            self._key = key
        return self._value


class CachedCat(CachedWeights):
    """cat([owner.<name>.<attr> for name in names], dim), kept between calls (see `CachedWeights`)."""

    def __init__(self, owner: nn.Module, names: tuple[str, ...], attr: str = "weight", dim: int = 0):
        super().__init__(owner, names, functools.partial(_cat, dim=dim), attr)


def _cat(*parts: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.cat(parts, dim)


class FusedLinears:
    """x [..., D] -> one output per group of the owner's Linear layers (named) that read x: group g gives
    cat([x W^T for W in g], -1). A plain object, not an nn.Module: nothing joins state_dict or modules().
    Where a named layer is no longer a bias-free nn.Linear (swapped for something else), the layers run
    one by one, exactly as without the fusion.
    """

    def __init__(self, owner: nn.Module, *groups: tuple[str, ...]):
        self.owner, self.groups = owner, groups
        self.names = tuple(name for group in groups for name in group)
        self.weight = CachedCat(owner, self.names)
        self._seen: list | None = None     # the modules last seen, and whether they are all nn.Linear
        self._linear = False
        starts = [0]
        for group in groups:
            starts.append(starts[-1] + len(group))
        self._spans = list(zip(starts, starts[1:]))    # each group's slice of the flat list

    def _layers(self) -> list[list[nn.Module]]:
        return [[getattr(self.owner, name) for name in group] for group in self.groups]

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        modules = self.owner._modules      # (the dict itself: nn.Module.__getattr__ is the slow way at decode)
        flat = [modules.get(name) for name in self.names]
        if flat != self._seen:             # (identity first: the same modules are the common case)
            self._seen, self._linear = flat, all(isinstance(m, nn.Linear) for m in flat)
        params = [m._parameters for m in flat] if self._linear else None
        weights = None if params is None or any(p["bias"] is not None for p in params) else [p["weight"] for p in params]
        if weights is None or autograd_needed(weights):
            layers = self._layers()
            return [torch.cat([m(x) for m in group], -1) if len(group) > 1 else group[0](x) for group in layers]
        rows = [w.shape[0] for w in weights]
        sizes = [sum(rows[a:b]) for a, b in self._spans]
        return list(F.linear(x, self.weight(weights)).split(sizes, -1))


_SPARSE_WARNED = False


def sampled_product(rows: torch.Tensor, columns: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    scratch: str) -> torch.Tensor:
    """(a @ b) at the entries of the CSR pattern (crow indices `rows`, `columns`) -> their values [nnz], in the
    scratch buffer named `scratch` (`scratch_buffer`: valid until the next call that uses that name). a [R, K]
    contiguous, b [K, C] (a transposed view of a contiguous [C, K] is read as it is, with no copy).

    torch.sparse.sampled_addmm, beta=0, with the pattern as its own output (no copy of the pattern, no fresh
    values). Its CPU kernel adds beta * (the old value), and 0 * inf or NaN is NaN, so the values start at
    zero: a NaN from an earlier call could otherwise reach this one."""
    values = scratch_buffer("sampled " + scratch, (columns.numel(),), a).zero_()
    pattern = csr_matrix(rows, columns, values, (rows.numel() - 1, b.shape[1]))
    torch.sparse.sampled_addmm(pattern, a, b, beta=0.0, out=pattern)
    return values


def csr_matrix(rows: torch.Tensor, columns: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A sparse CSR matrix [shape] on these tensors (no copies, no checks: the callers build valid patterns).
    torch warns once per process that sparse CSR support is "in beta"; that says nothing to a reader of this
    simulator, so the first call hides it."""
    global _SPARSE_WARNED
    if _SPARSE_WARNED:
        return torch.sparse_csr_tensor(rows, columns, values, shape, check_invariants=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        matrix = torch.sparse_csr_tensor(rows, columns, values, shape, check_invariants=False)
    _SPARSE_WARNED = True
    return matrix
