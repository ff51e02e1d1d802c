"""The run: build one real-width layer at a time, time its decode step, free it (sim/measure/__init__.py).

`measure()` walks K3's layer kinds (KDA, gated MLA at each cache length, the MoE with only its touched
experts, the dense MLP, the head) and then K2's, at every batch, and hands the times to a `Measurement`,
which composes the models (measurement.py). A `Stopwatch` keeps what the steps took, in wall and CPU time.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import resource
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from tiny_k3.cache import KDAState
from tiny_k3.config import K3Config
from tiny_k3.model import resolve_device

from ..costs import expected_experts_touched
from . import layers as L
from .measurement import (DTYPES, LayerWork, Machine, Measurement, available_bytes, batch_key, check_memory, kda_work,
                          matvec_work, mla_work, parse_batches, parse_dtype, parse_tokens, schedules)

# ---------------------------------------------------------------------------- timing

def _sync(device: torch.device) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def time_step(step: Callable[[], object], repeats: int, warmup: int, sync: Callable[[], None]) -> float:
    """Median wall time of `step` over `repeats` calls, after `warmup` untimed calls."""
    return time_step_cpu(step, repeats, warmup, sync)[0]


def time_step_cpu(step: Callable[[], object], repeats: int, warmup: int,
                  sync: Callable[[], None]) -> tuple[float, float]:
    """(median wall time, median CPU time of this process) of `step` over `repeats` calls, after `warmup`."""
    for _ in range(warmup):
        step()
    sync()
    walls, cpus = [], []
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        step()
        sync()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def probe_machine(device: torch.device, dtype: torch.dtype, copy_values: int, gemm_n: int, repeats: int) -> Machine:
    """STREAM-like copy (b = a, float32: 2 x 4 bytes per value moved) and an n x n GEMM in `dtype`."""
    sync = _sync(device)
    with torch.no_grad():
        a = torch.ones(copy_values, device=device)
        b = torch.empty_like(a)
        bandwidth = 2 * a.numel() * a.element_size() / time_step(lambda: b.copy_(a), repeats, 1, sync)
        del a, b
        g = torch.Generator().manual_seed(0)
        x, y = (torch.randn(gemm_n, gemm_n, generator=g).to(device, dtype) for _ in range(2))
        flops = 2 * gemm_n ** 3 / time_step(lambda: x @ y, repeats, 1, sync)
    return Machine(bandwidth=bandwidth, flops=flops, threads=torch.get_num_threads(), name=device_name(device))


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} logical CPUs"


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux reports KiB


def _free(device: torch.device, collect: bool = True) -> None:
    """Give a freed layer's memory back before the next one is built (tensors go on their last reference;
    gc.collect catches any cycle, but costs seconds on a loaded machine: skipped at tiny widths)."""
    if collect:
        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _token(config: K3Config, device, dtype, seed: int) -> torch.Tensor:
    """A random RMS-normalised hidden state x [1, 1, D]: what each sublayer's pre-norm hands it."""
    x = torch.randn(1, 1, config.hidden_size, generator=torch.Generator().manual_seed(seed))
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))).to(device, dtype)


def steps_of(tokens: tuple[int, ...], batches: tuple[int, ...] = (1,)) -> int:
    """How many items `measure` reports to its progress callback."""
    return 1 + len(batches) * (6 + 2 * len(tokens)) + 4 * sum(1 for b in batches if b > 1)


def _batched(x: torch.Tensor, batch: int) -> torch.Tensor:
    """x [1, 1, D] repeated to [batch, 1, D] (every sequence decodes a token; values do not change the time)."""
    return x if batch == 1 else x.expand(batch, -1, -1).contiguous()


@dataclass
class Stopwatch:
    """What each timed step took (median wall and CPU seconds, by key), what it read and computed, and the bytes
    its module holds; `tick` reports progress before each item."""
    repeats: int
    warmup: int
    sync: Callable[[], None]
    total: int
    progress: Callable[[int, int, str], None] | None = None
    done: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    work: dict[str, LayerWork] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)

    def tick(self, what: str) -> None:
        if self.progress is not None:
            self.progress(self.done, self.total, what)
        self.done += 1

    def timed(self, key: str, step: Callable[[], object]) -> float:
        self.seconds[key], self.cpu[key] = time_step_cpu(step, self.repeats, self.warmup, self.sync)
        return self.seconds[key]

    def layer(self, name: str, module: torch.nn.Module, step: Callable[[], object], layer_work: LayerWork,
              batch: int) -> None:
        """Time one layer's step at `batch` under `name` ("kda", "mla@4096", ...), and note its work and bytes."""
        self.timed(batch_key(name, batch), step)
        self.work.setdefault(name.partition("@")[0], layer_work)
        self.held.setdefault(name.partition("@")[0], L.tensor_bytes(module))


def _time_kda(watch: Stopwatch, c: K3Config, x1: torch.Tensor, batches, dev, tdtype) -> None:
    kda = L.build_kda(c, dev, tdtype)
    H, K = c.kda_heads, c.kda_head_dim
    for b in batches:
        watch.tick(f"KDA layer, batch {b}")
        x = _batched(x1, b)
        state = KDAState(torch.zeros(b, H, K, K, device=dev),
                         torch.zeros(b, c.kda_conv_kernel - 1, 3 * H * K, device=dev, dtype=tdtype))
        watch.layer("kda", kda, lambda: kda(x, state), kda_work(kda), b)
        del state


def _time_mla(watch: Stopwatch, c: K3Config, x1: torch.Tensor, prefix: str, tokens, batches, dev, tdtype,
              collect: bool) -> None:
    mla = L.build_mla(c, dev, tdtype, gated=not prefix)
    for b in batches:
        x = _batched(x1, b)
        for t in tokens:
            watch.tick(f"{prefix}MLA layer at {t:,} tokens, batch {b}")
            kv = L.latent_cache(c, t, dev, tdtype)
            kv = kv if b == 1 else kv.expand(b, -1, -1).contiguous()
            watch.layer(f"{prefix}mla@{t}", mla, lambda: L.absorbed_mla_step(mla, x, kv, t), mla_work(mla), b)
            del kv
            _free(dev, collect)


def _time_moe(watch: Stopwatch, c: K3Config, x1: torch.Tensor, prefix: str, batches, dev, tdtype) -> None:
    """Batch 1: the touched experts' step as it is. Batch B: the shell on B tokens plus the routed experts, timed as
    the held experts on floor(r) and floor(r) + 1 rows each (r = B k / E_B), interpolated, and scaled to the
    E_B = N (1 - (1 - k/N)^B) experts B tokens touch."""
    moe = L.TouchedMoE.random(c, x1, dev, tdtype, latent=not prefix)
    n_held, width = moe.w1.shape[0], moe.w1.shape[2]
    for b in batches:
        watch.tick(f"{prefix}MoE layer (touched experts only), batch {b}")
        if b == 1:
            watch.layer(f"{prefix}moe", moe, lambda: moe(x1), matvec_work(moe), 1)
            continue
        x = _batched(x1, b)
        watch.timed(f"{prefix}moe-shell#{b}", lambda: L.moe_shell_step(moe, x))
        r = L.rows_per_expert(c, b)
        lo = max(1, math.floor(r))
        for m in (lo, lo + 1):
            watch.tick(f"{prefix}MoE experts, {m} rows each, batch {b}")
            rows = torch.ones(n_held, width, m, device=dev, dtype=tdtype)
            watch.timed(f"{prefix}moe-experts{m}#{b}", lambda: L.moe_expert_step(moe, rows))
        scale = expected_experts_touched(c.num_experts, c.top_k, b) / n_held
        for clock in (watch.seconds, watch.cpu):
            lo_t, hi_t = clock[f"{prefix}moe-experts{lo}#{b}"], clock[f"{prefix}moe-experts{lo + 1}#{b}"]
            clock[batch_key(f"{prefix}moe", b)] = clock[f"{prefix}moe-shell#{b}"] + scale * (lo_t + (r - lo) * (hi_t - lo_t))


def _time_dense_and_head(watch: Stopwatch, c: K3Config, x1: torch.Tensor, prefix: str, batches, dev, tdtype,
                         collect: bool) -> None:
    builders = [("dense", "dense MLP", L.build_dense)] + ([] if prefix else [("head", "final norm + LM head", L.build_head)])
    for name, what, build in builders:
        module = build(c, dev, tdtype)
        for b in batches:
            watch.tick(f"{prefix}{what}, batch {b}" if name == "dense" else f"{what}, batch {b}")
            x = _batched(x1, b)
            watch.layer(f"{prefix}{name}" if name == "dense" else name, module, lambda: module(x), matvec_work(module), b)
        del module
        _free(dev, collect)


@torch.no_grad()
def measure(tokens: tuple[int, ...] | str | None = None, device: str | None = None, dtype: str | None = None,
            quick: bool = False, tiny: bool = False, progress: Callable[[int, int, str], None] | None = None,
            available: int | None = None, batches: tuple[int, ...] | str | None = None,
            load: float | None = None) -> Measurement:
    """Measure every layer kind and the machine; see the module docstring. Bad input: one ValueError sentence.

    tokens: cache lengths for the MLA layers (a tuple or "1024,8192"); default 1K..1M (quick: 1K..64K).
    batches: sequences per decode step (a tuple or "1,8,64"; default 1). At batch B every layer steps B tokens; the
    MoE step is its shell on B tokens (router, latent projections, shared experts) + the routed experts, timed as 16
    held experts on B k / E_B rows each and scaled to the E_B = N (1 - (1 - k/N)^B) experts B tokens touch.
    tiny: K3's topology at tiny widths (`k3-topo`), for tests and lessons: seconds, numbers mean nothing.
    progress(done, total, what) is called before each item. available: override the free-memory probe; load: the
    load average at start (default: os.getloadavg()).
    """
    dev = resolve_device(device)
    dtype, dtype_reason = parse_dtype(dtype, dev)
    tokens = parse_tokens(tokens if tokens is None or isinstance(tokens, str) else ",".join(map(str, tokens)), quick)
    batches = parse_batches(batches if batches is None or isinstance(batches, str) else ",".join(map(str, batches)),
                            quick)
    w = L.widths(tiny)
    tdtype = DTYPES[dtype]
    element_bytes = torch.tensor([], dtype=tdtype).element_size()
    check_memory(w, tokens[-1], element_bytes, dtype, available_bytes(dev) if available is None else available,
                 batch=batches[-1])
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)

    repeats, warmup = (3, 1) if (quick or tiny) else (7, 2)
    copy_values, gemm_n = ((1 << 20, 256) if tiny else (1 << 28, 8192) if dev.type == "cuda"
                           else (32 << 20, 2048) if quick else (64 << 20, 2048))
    watch = Stopwatch(repeats, warmup, _sync(dev), steps_of(tokens, batches), progress)
    watch.tick("this machine: copy bandwidth and GEMM FLOP/s")
    machine = probe_machine(dev, tdtype, copy_values, gemm_n, repeats)
    collect = not tiny
    for prefix, c in (("", w.k3), ("k2-", w.k2)):
        x1 = _token(c, dev, tdtype, seed=1)
        if not prefix:
            _time_kda(watch, c, x1, batches, dev, tdtype)
            _free(dev, collect)
        _time_mla(watch, c, x1, prefix, tokens, batches, dev, tdtype, collect)
        _free(dev, collect)
        _time_moe(watch, c, x1, prefix, batches, dev, tdtype)
        _free(dev, collect)
        _time_dense_and_head(watch, c, x1, prefix, batches, dev, tdtype, collect)

    c = w.k3
    full_moe = watch.held["moe"] + (c.num_experts - c.top_k) * 3 * c.moe_intermediate * c.latent_dim * element_bytes
    return Measurement(
        device=dev.type, device_name=machine.name, dtype=dtype, widths=w.name, quick=quick, tokens=tokens,
        repeats=repeats, warmup=warmup, machine=machine, work=watch.work, seconds=watch.seconds, schedules=schedules(w),
        held_bytes=watch.held, moe_full_bytes=int(full_moe), peak_bytes=_peak_bytes(dev),
        torch_version=torch.__version__, created=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        batches=batches, cpu_seconds=watch.cpu, load_at_start=float(load), cpus=os.cpu_count() or 0,
        dtype_reason=dtype_reason,
    )
