"""The opt-in compiled path: one switch, and the ops it compiles (torch.compile, inductor, on CPU a C++ compiler).

    TINY_K3_COMPILE=1 python ...          every op below runs compiled in this process
    python -m tiny_k3.train --compile     the same for one training run (calls `enable()`)

Off by default: the TUI and the lessons run the readable eager code and nobody waits for a compile. Each op that
takes part is an `Op` made where the op is defined (`compiled.op(name, fn)`), so this switch is the one place that
decides and every op keeps its eager reference beside it:

| op                  | where                        | why it pays (bench/bench_train.py, bench/bench_kda.py)           |
|---------------------|------------------------------|------------------------------------------------------------------|
| `kda_chunked`       | kda_chunk.kda_chunked_compiled | with autograd: the chunk loop's small ops, forward and backward, as fused kernels |
| (C recurrence)      | native.kda_recurrent_native  | without autograd on the CPU: KDA's recurrence as a C loop (kda_native.c, built with $CC) |
| (C expert products) | moe_native.mix_experts_native | the MoE's expert products, forward and backward, pairs in expert order (moe_native.c) |
| (C selection)       | moe_native.sigmoid_top_k_ids_native | the router's sigmoid and top-k of 896 in one pass: the few above a checked floor, ranked (moe_native.c) |
| (C chosen scores)   | moe.ChosenScores             | the router's backward at its k chosen scores: k rows of W per token (moe_native.c) |
| (C conv)            | conv_native.conv_heads_native | with autograd: KDA's short conv, SiLU and q/k norms, forward and backward (conv_native.c) |
| (C RMSNorm)         | norm.RMSNormNative           | with autograd: RMSNorm in one pass each way, not six forward and ten back (norm_native.c) |
| `kda_gate`          | kda.kda_gate                 | the decay gate's five element-wise passes (and their backward) as one |
| `kda_conv`          | kda.conv_heads               | the C conv's fallback: the conv as shifted products, SiLU and q/k norms, fused |
| (C SiTU-GLU)        | moe_native.SituGLU           | with autograd: SiTU-GLU in one pass each way (moe_native.c) |
| `situ_glu`          | moe.situ_glu                 | the C SiTU-GLU's fallback: its seven element-wise passes (and their backward) as one |
| `depth_attention`   | attnres.depth_attention_of   | a depth read with autograd (stack, norm, softmax, sum; backward) in a few kernels: ~5x |
| (fused AdamW)       | train.adamw                  | torch's fused AdamW: one kernel for every parameter instead of ten small ops each |

Where no C++ compiler is found, or compiling an op fails, that op runs eager and one line says why (a
RuntimeWarning): the compiled path never stops a run. The C kernels are built by tiny_k3/native.py with the
system C compiler (about a tenth of a second, once per machine) and fall back the same way. Compiled and eager results
agree to float rounding (tests/test_compiled.py: float64, forward and backward, each op and a whole training step;
tests/test_native.py and test_native_training.py: the C kernels against the definition and the PyTorch paths).
"""

from __future__ import annotations

import os
import shutil
import time
import warnings

import torch

ENV_VAR = "TINY_K3_COMPILE"


def switched_on(value: str | None) -> bool:
    """Whether a value of TINY_K3_COMPILE turns the compiled path on: anything but unset, empty, 0, false, no, off."""
    return (value or "").strip().lower() not in ("", "0", "false", "no", "off")


_enabled = switched_on(os.environ.get(ENV_VAR))
_warned: set[str] = set()


def enabled() -> bool:
    """Whether the ops run compiled: TINY_K3_COMPILE set (not 0), or `enable()` called."""
    return _enabled


def enable(on: bool = True) -> None:
    """Turn the compiled path on (or off) for this process, as TINY_K3_COMPILE=1 does at start-up."""
    global _enabled
    _enabled = on


def compiler_problem() -> str | None:
    """Why inductor cannot compile here, or None. On CPU it writes C++ and builds it with $CXX, g++, c++ or clang++
    (torch's own search, torch._inductor.config.cpp.cxx, tries the same names)."""
    names = [os.environ.get("CXX")] + ["g++", "c++", "clang++"]
    if not any(name and shutil.which(name) for name in names):
        return "no C++ compiler found ($CXX, g++, c++ or clang++), which inductor needs on the CPU"
    return None


def fall_back(name: str, reason: str) -> None:
    """Say once per op (one line, a RuntimeWarning) that it runs eager, and why."""
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"tiny_k3: {name} runs eager, not compiled: {reason}", RuntimeWarning, stacklevel=3)


class Op:
    """`fn`, compiled on first use while the switch is on; `fn` itself while it is off or where compiling fails.

    `dynamic` is torch.compile's: False compiles once per input shape (the fastest kernels; a training run has a
    few shapes), True once for all shapes (ops whose shapes change every call). `compile_seconds` adds up the
    calls that compiled (the first call at each new shape), for the benches and the training log.
    """

    def __init__(self, name: str, fn, dynamic: bool | None = False):
        self.name, self.eager, self.dynamic = name, fn, dynamic
        self._compiled = None
        self.failed: str | None = None
        self.compile_seconds = 0.0
        self._shapes: set = set()

    def __call__(self, *args, **kwargs):
        if not _enabled or self.failed is not None:
            return self.eager(*args, **kwargs)
        if self._compiled is None:
            problem = compiler_problem()
            if problem is not None:
                self.failed = problem
                fall_back("the compiled path", problem)
                return self.eager(*args, **kwargs)
            allow_recompiles()
            self._compiled = torch.compile(self.eager, dynamic=self.dynamic)
        key = tuple((tuple(a.shape), a.dtype, a.requires_grad) for a in args if isinstance(a, torch.Tensor))
        start = time.perf_counter()
        try:
            result = self._compiled(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a compiler failure of any kind: run eager instead
            result = self.eager(*args, **kwargs)   # an error of the inputs themselves raises here, as eager does
            self.failed = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            fall_back(self.name, self.failed)
            return result
        if key not in self._shapes:      # (a first call at this shape: most of its time is the compile)
            self._shapes.add(key)
            self.compile_seconds += time.perf_counter() - start
        return result


# Graphs one op may keep (torch's `recompile_limit`, 8 by default, after which it silently runs eager): a static op
# compiles once per shape, and a run meets several, e.g. the depth read once per number of sources (1 to 5 in
# `small`) at each curriculum stage's rows.
RECOMPILE_LIMIT = 64


def allow_recompiles(limit: int = RECOMPILE_LIMIT) -> None:
    """Let every compiled op keep at least `limit` graphs (torch._dynamo.config.recompile_limit)."""
    import torch._dynamo.config as dynamo   # (inside: importing dynamo costs time that eager runs never pay)
    name = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"   # (older torch)
    setattr(dynamo, name, max(getattr(dynamo, name), limit))


_OPS: dict[str, Op] = {}


def op(name: str, fn, dynamic: bool | None = False) -> Op:
    """The `Op` of `fn` under this name (one per name, listed by `ops()`)."""
    _OPS[name] = Op(name, fn, dynamic)
    return _OPS[name]


def ops() -> dict[str, Op]:
    """Every op registered so far, by name (what the benches and the training log report)."""
    return dict(_OPS)


def compile_seconds() -> float:
    """Seconds spent in calls that compiled, over every op (0 while the switch is off)."""
    return sum(o.compile_seconds for o in _OPS.values())
