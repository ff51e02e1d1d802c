"""What a sequence of torch ops could take at best: every op of one call, replayed alone with warm caches.

    from op_floor import record_ops, replay_floor
    ops = record_ops(lambda: kda_chunked(*x))        # every aten op the call runs, with copies of its arguments
    floor = replay_floor(ops)                        # each op timed alone (best of a few runs, caches warm)
    print(floor.total_ms, floor.by_op[:5])

The sum is a floor for *this* sequence of ops on this machine, whatever the code around it does: it leaves out
the Python between ops, and each op finds its operands in cache, as no op of a real call does when the call's
working set is larger than L2. It tells "the ops are slow" (a floor near the call's time) from "the glue and the
cache misses are slow" (a floor far below it). Only for benchmarks: recording copies every tensor argument.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map


@dataclass
class RecordedOp:
    name: str                 # the aten overload, e.g. "aten.bmm.out"
    func: object              # the overload itself, to call again
    args: tuple               # copies of the tensor arguments (same shapes and strides), other arguments as given
    kwargs: dict


@dataclass
class Floor:
    total_ms: float                              # Σ over the recorded ops of each one's best time alone
    by_op: list[tuple[str, int, float]]          # (aten op, calls, ms in all), the largest first


def _copy(x):
    """A tensor argument's copy with its strides (views of larger tensors become standalone tensors; a
    broadcast, stride-0 dimension stays broadcast)."""
    if not isinstance(x, torch.Tensor):
        return x
    base = x[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in x.stride())]
    copy = torch.empty_strided(base.shape, base.stride(), dtype=x.dtype, device=x.device).copy_(base)
    return copy.expand(x.shape)


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[RecordedOp] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops.append(RecordedOp(str(func), func, tree_map(_copy, args), tree_map(_copy, kwargs)))
        return func(*args, **kwargs)


_METADATA_ONLY = ("aten.view", "aten.permute", "aten.unsqueeze", "aten.squeeze", "aten.expand", "aten.slice",
                  "aten.select", "aten.unbind", "aten.t.", "aten.transpose", "aten.as_strided", "aten.unflatten",
                  "aten.alias", "aten.detach", "aten._unsafe_view", "aten.split", "aten.narrow", "aten.diagonal",
                  "aten.mT", "aten.lift_fresh", "aten.empty", "aten.item", "aten._local_scalar_dense",
                  "aten.is_nonzero")


def record_ops(call) -> list[RecordedOp]:
    """Every aten op `call()` runs that touches data (views and allocations are left out: a view costs no
    memory traffic, and its dispatch is part of the glue this floor excludes)."""
    with _Recorder() as recorder:
        call()
    return [op for op in recorder.ops if not op.name.startswith(_METADATA_ONLY)]


def _written(op: RecordedOp) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(argument, a pristine copy) for each tensor the op writes (in place or `out=`), from its schema."""
    schema = op.func._schema
    written = []
    for i, arg in enumerate(schema.arguments):
        value = op.args[i] if i < len(op.args) else op.kwargs.get(arg.name)
        if isinstance(value, torch.Tensor) and arg.alias_info is not None and arg.alias_info.is_write:
            written.append((value, value.clone()))
    return written


def replay_floor(ops: list[RecordedOp], repeats: int = 5) -> Floor:
    """Each recorded op run `repeats` times on its own copies, its best time kept. What the op writes is put
    back before each run (an in-place op would otherwise work on its own result, and a repeated decay can
    sink into subnormals, which are slow); that copy also warms the caches, which is the point."""
    totals, calls = collections.defaultdict(float), collections.Counter()
    for op in ops:
        written, best = _written(op), float("inf")
        for _ in range(repeats):
            for arg, pristine in written:
                arg.copy_(pristine)
            start = time.perf_counter()
            op.func(*op.args, **op.kwargs)
            best = min(best, time.perf_counter() - start)
        totals[op.name] += best
        calls[op.name] += 1
    by_op = sorted(((name, calls[name], 1e3 * ms) for name, ms in totals.items()), key=lambda row: -row[2])
    return Floor(1e3 * sum(totals.values()), by_op)
