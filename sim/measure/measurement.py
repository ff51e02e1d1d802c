"""Time one decode step of each K3 layer kind at real widths, and compose the models from the parts.

`measure()` builds one layer at a time (sim/measure/layers.py), times its decode step (median of
`repeats` after `warmup`), records what the step reads and computes (`LayerWork`), and frees it. It also
probes the machine: a STREAM-like copy (bytes read + written per second) and a large GEMM (FLOP/s).
A `Measurement` composes the per-token decode time of three models by their layer schedules:

    K3       69 KDA + 24 MLA(T) + 92 MoE + dense + head      (k3_facts.md §1)
    twin     93 MLA(T)           + 92 MoE + dense + head      (K3Config.twin(): every layer gated MLA)
    K2       61 MLA_K2(T)        + 60 MoE_K2 + dense_K2 + head (docs/k2_config.md)

Not timed (each well under 1% of a step at these widths): the embedding lookup, the pre-norms of each
sublayer, and Attention Residuals' depth read (at most 9 sources of D values per sublayer in K3).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tiny_k3.config import K3Config
from tiny_k3.kda import KDALayer
from tiny_k3.mla import GatedMLA
from tiny_k3.moe import GatedMLP, LatentMoE

from ..memory import MIB_CONTEXT, format_bytes
from . import layers as L

FULL_TOKENS = (1024, 8192, 65536, 262144, MIB_CONTEXT)
MAX_BATCH, QUICK_MAX_BATCH = 1024, 64
TOO_LOADED = 0.75       # load average at start, per CPU, from which a CPU measurement is not trusted
BUSY_ENOUGH = 0.6       # CPU time / (wall time x threads) below which the steps were starved of CPU
QUICK_TOKENS = (1024, 8192, 65536)
QUICK_MAX = 65536
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MODELS = {"k3": "K3", "twin": "all-MLA twin", "k2": "K2-shaped"}
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


# ---------------------------------------------------------------------------- what a step reads and computes

@dataclass(frozen=True)
class LayerWork:
    """One decode step of one layer, counted from the live module (T = tokens already cached).

    weights       weight values read (every weight once: a decode step is a matrix-vector product)
    io_values     other values in the layer's dtype read or written (KDA's conv tail in and out, MLA's new row)
    fp32_bytes    float32 traffic (KDA's state S read and written; the router's selection bias)
    cache_width   values read per cached token (MLA: kv_lora_rank + qk_rope_dim = 576; 0 otherwise)
    flops         FLOPs at T = 0: 2 per weight, plus KDA's recurrence (7 H K V, as sim.costs)
    flops_per_token  FLOPs per cached token (absorbed MLA: 2 H (r + rope) for the scores + 2 H r for p.c)
    """

    weights: int
    io_values: int = 0
    fp32_bytes: int = 0
    cache_width: int = 0
    flops: float = 0.0
    flops_per_token: float = 0.0

    def bytes_at(self, tokens: int, element_bytes: int) -> float:
        """Bytes one step moves at `tokens` cached tokens with weights and cache of `element_bytes` each."""
        cached = self.cache_width * (tokens + 1) if self.cache_width else 0   # the new row is attended too
        return (self.weights + self.io_values + cached) * element_bytes + self.fp32_bytes

    def flops_at(self, tokens: int) -> float:
        return self.flops + (self.flops_per_token * (tokens + 1) if self.flops_per_token else 0.0)


def _weights(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def kda_work(layer: KDALayer) -> LayerWork:
    H, K = layer.num_heads, layer.head_k_dim
    conv = (layer.conv_kernel - 1) * 3 * H * K
    w = _weights(layer)
    return LayerWork(weights=w, io_values=2 * conv, fp32_bytes=2 * H * K * K * 4, flops=2.0 * w + 7 * H * K * K)


def mla_work(mla: GatedMLA) -> LayerWork:
    w, width = _weights(mla), mla.kv_rank + mla.rope
    return LayerWork(weights=w, io_values=width, cache_width=width, flops=2.0 * w,
                     flops_per_token=2.0 * mla.heads * (width + mla.kv_rank))


def matvec_work(module: torch.nn.Module) -> LayerWork:
    """Dense MLP, LM head, the MoE with its held experts: every weight once, fp32 buffers (router bias) too."""
    w = _weights(module)
    fp32 = sum(b.numel() * 4 for b in module.buffers() if b.dtype == torch.float32)
    return LayerWork(weights=w, fp32_bytes=fp32, flops=2.0 * w)


# ---------------------------------------------------------------------------- the result

@dataclass(frozen=True)
class Machine:
    """This machine as the probes saw it: copy bandwidth (B/s, read + write) and GEMM FLOP/s in the dtype."""

    bandwidth: float
    flops: float
    threads: int
    name: str

    @property
    def ridge(self) -> float:
        return self.flops / self.bandwidth


@dataclass(frozen=True)
class Measurement:
    """Everything one run measured; composes the models' per-token decode time from the parts."""

    device: str
    device_name: str
    dtype: str
    widths: str
    quick: bool
    tokens: tuple[int, ...]
    repeats: int
    warmup: int
    machine: Machine
    work: dict[str, LayerWork]
    seconds: dict[str, float]            # "kda", "moe", ... and "mla@T", "k2-mla@T" per T
    schedules: dict[str, dict[str, int]]  # model -> layer -> how many of it
    held_bytes: dict[str, int]           # bytes of each layer as allocated (MLA: its weights)
    moe_full_bytes: int                  # bytes of a whole K3 MoE layer (all experts) at this dtype
    peak_bytes: int                      # peak resident memory of the process (CPU) or allocated (CUDA)
    torch_version: str = ""
    created: str = ""
    extra: dict = field(default_factory=dict)
    batches: tuple[int, ...] = (1,)      # sequences per decode step; batch 1's keys carry no "#B"
    cpu_seconds: dict[str, float] = field(default_factory=dict)   # CPU time of the process per timed step (median)
    load_at_start: float = -1.0          # 1-minute load average when the run began (-1: not recorded)
    cpus: int = 0
    dtype_reason: str = ""

    @property
    def element_bytes(self) -> int:
        return torch.tensor([], dtype=DTYPES[self.dtype]).element_size()

    def step_seconds(self, layer: str, tokens: int, batch: int = 1) -> float:
        key = f"{layer}@{tokens}" if self.work[layer].cache_width else layer
        key = batch_key(key, batch)
        if key not in self.seconds:
            if batch not in self.batches:
                raise ValueError(f"batch {batch} was not measured; measured: {', '.join(map(str, self.batches))}.")
            raise ValueError(f"{layer} was not measured at {tokens:,} tokens; measured: "
                             f"{', '.join(f'{t:,}' for t in self.tokens)}.")
        return self.seconds[key]

    def parts(self, model: str, tokens: int, batch: int = 1) -> dict[str, float]:
        """Seconds per decode step spent in each layer kind of `model` at `tokens` (count x one step)."""
        return {layer: n * self.step_seconds(layer, tokens, batch) for layer, n in self.schedules[model].items()}

    def per_token(self, model: str, tokens: int, batch: int = 1) -> float:
        """Measured seconds of one decode step of `model` ("k3", "twin", "k2") at `tokens` cached tokens for `batch`
        sequences (at batch 1: the seconds per token)."""
        return sum(self.parts(model, tokens, batch).values())

    def speedup(self, tokens: int, baseline: str = "twin", batch: int = 1) -> float:
        """How many times faster K3 decodes than `baseline`, measured (same batch: the step-time ratio)."""
        return self.per_token(baseline, tokens, batch) / self.per_token("k3", tokens, batch)

    @property
    def busy(self) -> float | None:
        """CPU time / (wall time x threads) over all timed steps: near 1 when the steps had the CPUs to themselves
        (None where CPU time was not recorded, or on CUDA, where the host waits)."""
        if self.device != "cpu" or not self.cpu_seconds:
            return None
        keys = [k for k in self.cpu_seconds if k in self.seconds]
        wall = sum(self.seconds[k] for k in keys)
        return sum(self.cpu_seconds[k] for k in keys) / (wall * max(1, self.machine.threads)) if wall else None

    def distrust(self) -> str | None:
        """Why this machine was too loaded to trust a ratio (one clause), or None."""
        if self.device != "cpu":
            return None
        if self.load_at_start >= 0 and self.cpus and self.load_at_start >= TOO_LOADED * self.cpus:
            return f"load average {self.load_at_start:.2f} on {self.cpus} CPUs at start"
        busy = self.busy
        if busy is not None and busy < BUSY_ENOUGH:
            return f"the steps got {busy:.0%} of their threads' CPU time (other processes ran)"
        return None

    def bytes_per_token(self, model: str, tokens: int, element_bytes: int | None = None) -> float:
        e = self.element_bytes if element_bytes is None else element_bytes
        return sum(n * self.work[layer].bytes_at(tokens, e) for layer, n in self.schedules[model].items())

    def bandwidth_speedup(self, tokens: int, baseline: str = "twin") -> float:
        """The pure bandwidth model of the same steps: bytes(baseline) / bytes(K3) at this dtype."""
        return self.bytes_per_token(baseline, tokens) / self.bytes_per_token("k3", tokens)

    def roofline_per_token(self, model: str, tokens: int, bandwidth: float, flops: float,
                           element_bytes: int = 2) -> float:
        """Each layer at max(bytes / bandwidth, FLOPs / flops), composed by the schedule (default: bf16)."""
        return sum(n * max(self.work[layer].bytes_at(tokens, element_bytes) / bandwidth,
                           self.work[layer].flops_at(tokens) / flops)
                   for layer, n in self.schedules[model].items())

    def roofline_speedup(self, tokens: int, bandwidth: float, flops: float, baseline: str = "twin",
                         element_bytes: int = 2) -> float:
        return (self.roofline_per_token(baseline, tokens, bandwidth, flops, element_bytes)
                / self.roofline_per_token("k3", tokens, bandwidth, flops, element_bytes))

    def fractions(self, key: str) -> tuple[float, float]:
        """(achieved / copy bandwidth, achieved / GEMM FLOP/s) of one timed step ("kda", "mla@65536", ...)."""
        layer, _, t = key.partition("@")
        tokens = int(t) if t else 0
        s = self.seconds[key]
        w = self.work[layer]
        return (w.bytes_at(tokens, self.element_bytes) / s / self.machine.bandwidth,
                w.flops_at(tokens) / s / self.machine.flops)

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["tokens"] = list(self.tokens)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Measurement":
        d = dict(d)
        d["machine"] = Machine(**d["machine"])
        d["work"] = {k: LayerWork(**v) for k, v in d["work"].items()}
        d["tokens"] = tuple(d["tokens"])
        d["batches"] = tuple(d.get("batches", (1,)))
        return cls(**d)


def save(measurement: Measurement, path: str | Path | None = None) -> Path:
    """Write the measurement as JSON: `path`, else bench/results/measure-<device>[-quick].json."""
    path = Path(path) if path else RESULTS / f"measure-{measurement.device}{'-quick' if measurement.quick else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(measurement.to_json(), indent=1) + "\n")
    return path


SAVED_NAMES = ("measure-cuda.json", "measure-cpu.json", "measure-cuda-quick.json", "measure-cpu-quick.json")
# A measurement taken by the project on its own machine, for the lesson; never shown as "this machine's".
SHIPPED = RESULTS / "shipped" / "measure-cpu-quick.json"


def saved_paths() -> list[Path]:
    """This machine's saved measurements (`--save` without a path), the most telling first: full before quick,
    CUDA before CPU. The shipped measurement in bench/results/shipped/ is not one of them."""
    return [RESULTS / name for name in SAVED_NAMES if (RESULTS / name).is_file()]


def load_saved(path: str | Path | None = None) -> Measurement | None:
    """A measurement written by `python -m sim measure --save`: `path`, else the first of `saved_paths()`
    (None when there is none). A file that is not a saved measurement is a clear ValueError."""
    if path is None:
        paths = saved_paths()
        if not paths:
            return None
        path = paths[0]
    path = Path(path)
    if not path.exists():
        raise ValueError(f"no saved measurement at {path}; write one with `python -m sim measure --save`.")
    try:
        return Measurement.from_json(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError, KeyError) as exc:
        raise ValueError(f"{path} is not a measurement saved by `python -m sim measure --save` ({exc}).") from None


# ---------------------------------------------------------------------------- input checks and memory

def parse_tokens(text: str | None, quick: bool) -> tuple[int, ...]:
    """'1024,8192' -> (1024, 8192): sorted, unique, each 1..1,048,576 (K3's context); --quick: at most 65,536."""
    if text is None:
        return QUICK_TOKENS if quick else FULL_TOKENS
    try:
        values = sorted({int(v.replace("_", "")) for v in str(text).split(",") if v.strip()})
    except ValueError:
        raise ValueError(f"--tokens must be comma-separated whole numbers like 1024,8192,65536; got {text!r}.") from None
    if not values or values[0] < 1 or values[-1] > MIB_CONTEXT:
        raise ValueError(f"--tokens must lie between 1 and {MIB_CONTEXT:,} (K3's context length); got {text!r}.")
    if quick and values[-1] > QUICK_MAX:
        raise ValueError(f"--quick measures at most {QUICK_MAX:,} tokens; drop --quick to measure {values[-1]:,}.")
    return tuple(values)


def batch_key(key: str, batch: int) -> str:
    """The `seconds` key of a step at `batch` sequences: batch 1 keeps the plain key ("kda", "mla@8192")."""
    return key if batch == 1 else f"{key}#{batch}"


def parse_batches(text: str | None, quick: bool) -> tuple[int, ...]:
    """'1,8,64' -> (1, 8, 64): sorted, unique, each 1..1,024 (--quick: at most 64)."""
    if text is None:
        return (1,)
    try:
        values = sorted({int(v.replace("_", "")) for v in str(text).split(",") if v.strip()})
    except ValueError:
        raise ValueError(f"--batch must be comma-separated whole numbers like 1,8,64; got {text!r}.") from None
    top = QUICK_MAX_BATCH if quick else MAX_BATCH
    if not values or values[0] < 1 or values[-1] > top:
        raise ValueError(f"--batch must lie between 1 and {top:,}{' with --quick' if quick else ''}; got {text!r}.")
    return tuple(values)


def cpu_bf16() -> str | None:
    """The CPU's bf16 instructions ('amx_bf16', 'avx512_bf16'), or None when /proc/cpuinfo lists neither."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith(("flags", "Features"))), [])
    except OSError:
        return None
    found = [f for f in ("amx_bf16", "avx512_bf16", "bf16") if f in flags]
    return ", ".join(found) or None


def parse_dtype(name: str | None, device: torch.device) -> tuple[str, str]:
    """(dtype, why): bfloat16 on CUDA and on a CPU with bf16 instructions, float32 on a CPU without (where bf16
    matrix products are emulated and slower than float32); an explicit --dtype wins."""
    if name is not None:
        if name not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}; got {name!r}.")
        return name, "asked for (--dtype)"
    if device.type == "cuda":
        return "bfloat16", "CUDA: bf16 tensor cores"
    bf16 = cpu_bf16()
    if bf16:
        return "bfloat16", f"this CPU has bf16 instructions ({bf16})"
    return "float32", "this CPU lists no bf16 instructions (amx_bf16, avx512_bf16): bf16 would be emulated, slower than float32"


def available_bytes(device: torch.device) -> int:
    """Free memory on the device: CUDA's free bytes, or the OS's MemAvailable."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _meta_weights(w: L.Widths) -> dict[str, int]:
    """Weight values of each layer as measured, counted on the meta device (nothing allocated)."""
    out = {}
    for prefix, c in (("", w.k3), ("k2-", w.k2)):
        moe = LatentMoE(c, device="meta")
        held = c.top_k * 3 * c.moe_intermediate * c.latent_dim
        rest = _weights(moe) - moe.w1.numel() - moe.w2.numel() - moe.w3.numel()
        if prefix:  # K2's MoE has no latent projections (TouchedMoE(latent=False))
            rest -= moe.down.weight.numel() + moe.up.weight.numel() + moe.latent_norm.weight.numel()
        out[f"{prefix}moe"] = rest + held
        out[f"{prefix}mla"] = _weights(GatedMLA(c, device="meta")) - (
            c.hidden_size * c.mla_heads * c.v_head_dim if prefix else 0)
        out[f"{prefix}dense"] = _weights(GatedMLP(c.hidden_size, c.dense_intermediate, c, device="meta"))
    out["kda"] = _weights(KDALayer(w.k3, device="meta"))
    out["head"] = w.k3.hidden_size * (w.k3.vocab_size + 1)
    return out


def mla_bytes_per_token(config: K3Config, element_bytes: int) -> int:
    """Memory one more cached token costs while the MLA step runs: its row, and its score in four copies
    (the scores in the dtype, in float32, the float32 softmax, the probabilities in the dtype)."""
    return config.mla_cache_width * element_bytes + config.mla_heads * (2 * element_bytes + 8)


def _sizes(w: L.Widths, tokens: int, element_bytes: int, batch: int = 1) -> dict[str, int]:
    """Bytes each measured layer holds while its step runs (the MLA layers with `batch` caches of `tokens`), with
    10% slack for temporaries and 400 MB for the runtime itself."""
    sizes = {name: n * element_bytes for name, n in _meta_weights(w).items()}
    sizes["mla"] += batch * (tokens + 1) * mla_bytes_per_token(w.k3, element_bytes)
    sizes["k2-mla"] += batch * (tokens + 1) * mla_bytes_per_token(w.k2, element_bytes)
    return {name: int(n * 1.1) + (400 << 20) for name, n in sizes.items()}


def estimate_peak_bytes(w: L.Widths, tokens: int, element_bytes: int, batch: int = 1) -> tuple[int, str]:
    """(bytes, which layer) of the largest thing one run holds at once: one layer, or an MLA layer with its caches."""
    sizes = _sizes(w, tokens, element_bytes, batch)
    what = max(sizes, key=sizes.get)
    return sizes[what], what


def check_memory(w: L.Widths, tokens: int, element_bytes: int, dtype: str, available: int, batch: int = 1) -> None:
    """Refuse, with the numbers, a run whose largest layer (or MLA caches) would not fit in `available` bytes."""
    need, what = estimate_peak_bytes(w, tokens, element_bytes, batch)
    if need <= available:
        return
    fixed = {name: n for name, n in _sizes(w, 0, element_bytes).items() if not name.endswith("mla")}
    largest = max(fixed, key=fixed.get)
    if fixed[largest] > available:
        raise ValueError(f"the {largest} layer alone needs about {format_bytes(fixed[largest])} at {dtype} but this "
                         f"machine has {format_bytes(available)} available; free some memory"
                         + (" or use --dtype bfloat16." if dtype == "float32" else "."))
    per_token = max(1.1 * mla_bytes_per_token(c, element_bytes) for c in (w.k3, w.k2))
    fit = int((available - _sizes(w, 0, element_bytes)["mla"]) // (per_token * batch))
    at = f" at batch {batch}" if batch > 1 else ""
    raise ValueError(f"measuring {tokens:,} tokens{at} needs about {format_bytes(need)} at {dtype} (the MLA layer with "
                     f"its latent cache{'s' if batch > 1 else ''}) but this machine has {format_bytes(available)} "
                     f"available; about {max(fit, 0):,} tokens would fit{at}.")


# ---------------------------------------------------------------------------- the composition

def schedules(w: L.Widths) -> dict[str, dict[str, int]]:
    """How many of each measured layer make up each model (from the configs' layer schedules)."""
    def of(c: K3Config, prefix: str) -> dict[str, int]:
        counts = {f"{prefix}kda": len(c.kda_layers), f"{prefix}mla": len(c.mla_layers),
                  f"{prefix}moe": len(c.moe_layers), f"{prefix}dense": c.first_k_dense, "head": 1}
        return {k: n for k, n in counts.items() if n}

    return {"k3": of(w.k3, ""), "twin": of(w.k3.twin(), ""), "k2": of(w.k2, "k2-")}
