"""One serving truth: every K3 speed-up figure the project prints comes from `speedups()`.

The twin. "K3's all-MLA twin" is `K3Config.twin()` at K3's widths: every attention layer is K3's own gated MLA,
with that layer's MLA weights (232M values) in place of the KDA layer's (444M) -- the model the simulator steps
beside K3 and the one `python -m sim measure` times. It reads *fewer* weights per step than K3 (82 GB of BF16
non-expert weights against 111 GB) and keeps 93 latent caches instead of 24. The older "same weights, KV only"
view (K3's weights with 93 caches) survives only as a labelled bound: its ceiling is L / L_MLA = 93 / 24.

The model of a decode step (k3_facts.md §5b, with FLOPs added): one step of `batch` sequences at `context`
cached tokens each reads

    bytes = W_dense + n_moe * N (1 - (1 - k/N)^B) * w_expert + B (L_MLA 576 b T + 2 S_kda)   (sim.costs.decode_step_bytes)
    flops = B * flops_per_token(config, T)                                                     (sim.costs.flops_per_token)

and takes max(bytes / (G BW eta), flops / (G F eta)) on G GPUs of bandwidth BW and dense BF16 FLOP/s F
(docs/accelerators.md), eta = 0.7 for both, no communication (optimistic, k3_facts.md §5b). The weights read grow with the
experts the batch touches: 16 of 896 per layer at batch 1, about 613 at batch 64. Tokens/s per GPU = B / t / G.
A speed-up is K3's tokens/s per GPU over the other model's on the same deployment; at equal batch that is the
ratio of step times (the latency ratio), at "the largest batch that fits" each model runs its own largest batch.

Memory: a deployment keeps 10% of each GPU for activations, workspace and runtime (as `sim.costs.gpus_needed`);
what is left after that and the weights holds the decode caches (`sim.memory.cache_bytes`), so the largest batch
that fits at context T is floor(left / (KV + state of one sequence at T)).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from tiny_k3 import K3Config

from .costs import (GPU_MEMORY, KIMI_LINEAR, KIMI_LINEAR_TPOT_MS, ServingModel, decode_step_bytes, decode_step_time,
                    flops_per_token, k2_serving_model, kimi_linear_kv_only_limit, kv_only_limit,
                    serving_model)
from .measure.accelerators import ACCELERATORS, REPORTED_SPEEDUP
from .memory import MIB_CONTEXT, cache_bytes, non_negative_int

ETA = 0.7            # fraction of peak bandwidth and of peak FLOP/s a decode step reaches (k3_facts.md §5b)
OVERHEAD = 0.1       # fraction of each GPU kept for activations, workspace and runtime (sim.costs.gpus_needed)
CONTEXTS = {"4K": 4096, "128K": 131072, "1M": MIB_CONTEXT}    # powers of two, like §5b's rows
BATCHES = (1, 64)    # the fixed batches, on the full deployment


# ---------------------------------------------------------------------------- deployments


@dataclass(frozen=True)
class Deployment:
    """`count` GPUs of one kind: memory (B), HBM bandwidth (B/s) and dense BF16 FLOP/s per GPU."""

    name: str
    gpu: str
    count: int
    memory: float
    bandwidth: float
    flops: float
    why: str

    @property
    def usable(self) -> float:
        """Bytes for weights and caches once activations, workspace and runtime have their OVERHEAD."""
        return self.count * self.memory * (1.0 - OVERHEAD)


def deployment(gpu: str, count: int, why: str = "") -> Deployment:
    acc = {a.name: a for a in ACCELERATORS}
    if gpu not in acc or gpu not in GPU_MEMORY:
        known = sorted(set(acc) & set(GPU_MEMORY))
        raise ValueError(f"unknown GPU {gpu!r}; GPUs with memory, bandwidth and FLOP/s on record: {', '.join(known)}.")
    if count < 1:
        raise ValueError(f"a deployment needs at least 1 GPU, got {count}.")
    return Deployment(f"{count}x{gpu}", gpu, count, GPU_MEMORY[gpu], acc[gpu].bandwidth, acc[gpu].bf16_flops, why)


# The seeds' full deployment: Moonshot's "64+ accelerators" (S11, S13), H200-class as in §5b; the smallest published
# recipes that hold the 1.56 TB release (S5). 8xH100 (640 GB) and 8xH200 (1.13 TB) cannot hold it (§0).
DEPLOYMENTS = {d.name: d for d in (
    deployment("H200", 64, "the seeds' full deployment: Moonshot's 64+ accelerators (S11, S13), H200-class as §5b"),
    deployment("H200", 16, "the smallest H200 recipe that holds the 1.56 TB release (SGLang, S5)"),
    deployment("B300", 8, "the smallest B300 recipe that holds the 1.56 TB release (SGLang, S5)"),
)}
FULL = "64xH200"


# ---------------------------------------------------------------------------- the models


@dataclass(frozen=True)
class Served:
    """What serving one model looks like: the step's bytes and FLOPs, their times, the bound, the throughput."""

    name: str
    deployment: str
    batch: int               # sequences decoded together (0: none fit)
    context: int
    weights: float           # bytes of all weights held
    memory_left: float       # bytes left for caches after weights and activations (may be negative)
    per_sequence: int        # KV + state bytes of one sequence at this context
    fitting_batch: int       # the largest batch whose caches fit in memory_left
    weights_read: float      # bytes of weights one step reads: non-expert + the experts the batch touches
    step_bytes: float
    step_flops: float
    t_bytes: float           # seconds if only the bytes counted
    t_flops: float           # seconds if only the FLOPs counted
    gpus: int

    @property
    def fits(self) -> bool:
        return 1 <= self.batch <= self.fitting_batch

    @property
    def step_s(self) -> float:
        return max(self.t_bytes, self.t_flops)

    @property
    def bound(self) -> str:
        return "compute" if self.t_flops > self.t_bytes else "bandwidth"

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.batch / self.step_s / self.gpus if self.batch else 0.0


@lru_cache(maxsize=None)
def models() -> dict[str, tuple[K3Config, ServingModel]]:
    """The three served models: K3 and its all-MLA twin in the release format (MXFP4 routed experts, BF16 rest),
    K2 as K2-Thinking ships (INT4 experts, BF16 rest; k3_facts.md §4)."""
    k3 = K3Config.preset("k3")
    twin = k3.twin()
    k2 = k2_serving_model()
    return {"K3": (k3, serving_model(k3)), "twin": (twin, serving_model(twin, name="K3 all-MLA twin")),
            "K2": (K3Config.preset("k2"), k2)}


def per_sequence_bytes(config: K3Config, context: int) -> int:
    """KV + state bytes one sequence holds at `context` tokens (sim.memory.cache_bytes)."""
    return sum(cache_bytes(config, context))


@lru_cache(maxsize=1)
def _k3() -> K3Config:
    return K3Config.preset("k3")


def bytes_held_ratio(context: int, config: K3Config | None = None) -> float:
    """Bytes one sequence holds at `context` tokens, the all-MLA twin's over K3's (default config: K3). A byte
    count, not a speed-up: 3.82x at 1M. Cheap (no model is counted): the TUI's memory panel prints it."""
    config = config or _k3()
    return per_sequence_bytes(config.twin(), context) / per_sequence_bytes(config, context)


def fitting_batch(config: K3Config, model: ServingModel, dep: Deployment, context: int) -> int:
    """The largest batch whose caches fit beside the weights: B fits and B + 1 does not (0 if none fits)."""
    left = dep.usable - model.weight_bytes
    per = per_sequence_bytes(config, context)
    if left < per:
        return 0
    batch = int(left // per)
    while sum(cache_bytes(config, context, batch + 1)) <= left:      # guard the float division at the edge
        batch += 1
    while batch and sum(cache_bytes(config, context, batch)) > left:
        batch -= 1
    return batch


def _resolve(dep: Deployment | str) -> Deployment:
    if isinstance(dep, Deployment):
        return dep
    if dep not in DEPLOYMENTS:
        raise ValueError(f"unknown deployment {dep!r}; named deployments: {', '.join(DEPLOYMENTS)}.")
    return DEPLOYMENTS[dep]


def _model(name: str) -> tuple[K3Config, ServingModel]:
    if name in models():
        return models()[name]
    if name in _EXTRA:
        return _EXTRA[name]()
    raise ValueError(f"unknown model {name!r}; served models: {', '.join([*models(), *_EXTRA])}.")


def serve(name: str, dep: Deployment | str, batch: int | None, context: int) -> Served:
    """One model on one deployment: `batch` sequences (None: the largest batch that fits) at `context` tokens.

    The bytes term is sim.costs.decode_step_time (k3_facts.md §5b's formula) on this deployment; the FLOPs term
    is batch x sim.costs.flops_per_token at the deployment's dense BF16 FLOP/s, at the same efficiency ETA.
    """
    dep = _resolve(dep)
    config, model = _model(name)
    context = non_negative_int(context, "context")
    if context < 1:
        raise ValueError(f"context must be at least 1 token (a decode step attends to something), got {context}.")
    if batch is not None and (not isinstance(batch, int) or batch < 1):
        raise ValueError(f"batch must be a whole number of at least 1 (or None for the largest that fits), "
                         f"got {batch!r}.")
    fit = fitting_batch(config, model, dep, context)
    b = fit if batch is None else batch
    if b:
        parts = decode_step_bytes(model, b, context)
        step, read = sum(parts.values()), parts["dense"] + parts["experts"]
        t_bytes = decode_step_time(model, b, context, gpus=dep.count, bandwidth=dep.bandwidth, eta=ETA)
        flops = b * flops_per_token(config, context)
    else:
        step = flops = t_bytes = read = 0.0
    return Served(name=name, deployment=dep.name, batch=b, context=context, weights=float(model.weight_bytes),
                  memory_left=dep.usable - model.weight_bytes, per_sequence=per_sequence_bytes(config, context),
                  fitting_batch=fit, weights_read=read, step_bytes=step, step_flops=flops, t_bytes=t_bytes,
                  t_flops=flops / (dep.count * dep.flops * ETA), gpus=dep.count)


def _kimi_linear() -> tuple[K3Config, ServingModel]:
    return KIMI_LINEAR, serving_model(KIMI_LINEAR, "bf16")


def _kimi_linear_twin() -> tuple[K3Config, ServingModel]:
    twin = KIMI_LINEAR.twin()
    return twin, serving_model(twin, "bf16", name="Kimi Linear all-MLA twin")


def _same_weights_twin() -> tuple[K3Config, ServingModel]:
    """The bound's twin: K3's weights read with 93 MLA caches (its FLOPs are counted as the real twin's: at the
    batches `crossover` asks about, the step is bandwidth-bound either way)."""
    k3 = K3Config.preset("k3")
    return k3.twin(), serving_model(k3, kv_config=k3.twin(), name="K3 weights, 93 caches (bound)")


_EXTRA = {"Kimi Linear": _kimi_linear, "Kimi Linear twin": _kimi_linear_twin, "same-weights twin": _same_weights_twin}


# ---------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Column:
    """A batch on a deployment: a fixed batch, or (batch None) the largest batch that fits each model."""

    name: str
    deployment: str
    batch: int | None


COLUMNS = (*(Column(f"batch {b}", FULL, b) for b in BATCHES),
           *(Column(f"largest fit, {d}", d, None) for d in DEPLOYMENTS))
ROWS = {"K3 against twin": "twin", "K3 against K2": "K2"}


@dataclass(frozen=True)
class Cell:
    row: str
    context: int
    column: Column
    k3: Served
    other: Served

    @property
    def speedup(self) -> float | None:
        """K3's tokens/s per GPU over the other model's; None when either holds no sequence or the batch does not
        fit one of them (a figure for a deployment that cannot run it is no figure)."""
        if not (self.k3.fits and self.other.fits):
            return None
        return self.k3.tokens_per_s_per_gpu / self.other.tokens_per_s_per_gpu


@dataclass(frozen=True)
class Figure:
    """A labelled figure beside the table: what it is, its value, where it sits, its source."""

    label: str
    value: float
    kind: str
    where: str
    source: str


@dataclass(frozen=True)
class ServingTable:
    cells: tuple[Cell, ...]
    bound: Figure                    # same weights, KV only: 93 / 24
    kv_only: dict[int, float]        # the same bound's value at each context (cache bytes only, B -> infinity)
    closest: dict[str, Figure]       # per row: the cell nearest "up to 6.3x"
    claim: Figure                    # "up to 6.3x" (S14)
    kimi_linear: Figure              # measured 6.24x (S16, S34)
    kimi_linear_model: Figure        # the same roofline on Kimi Linear vs its all-MLA twin, 1M, batch 1
    kimi_linear_bound: Figure        # Kimi Linear's same-weights, KV-only bound at 1M
    kimi_linear_ceiling: Figure      # Kimi Linear's L / L_MLA = 27 / 7

    def cell(self, row: str, context: int | str, column: str) -> Cell:
        context = CONTEXTS.get(context, context)
        for c in self.cells:
            if c.row == row and c.context == context and c.column.name == column:
                return c
        raise ValueError(f"no cell ({row!r}, {context!r}, {column!r}); rows: {', '.join(ROWS)}; contexts: "
                         f"{', '.join(CONTEXTS)}; columns: {', '.join(c.name for c in COLUMNS)}.")

    def speedup(self, row: str, context: int | str, column: str) -> float | None:
        return self.cell(row, context, column).speedup

    def memory_ratio(self, row: str, context: int | str) -> float:
        """Bytes one sequence holds, the other model's over K3's (a byte count, not a speed-up): twin at 1M 3.82x."""
        c = self.cell(row, context, COLUMNS[0].name)
        if row == "K3 against twin":
            return bytes_held_ratio(c.context)
        return c.other.per_sequence / c.k3.per_sequence

    def figures(self) -> set[str]:
        """Every ratio this table gives, as printed (two decimals): what a lesson may print as a speed-up."""
        values = [c.speedup for c in self.cells if c.speedup is not None]
        values += [self.bound.value, *self.kv_only.values(), self.claim.value, self.kimi_linear.value,
                   self.kimi_linear_model.value, self.kimi_linear_bound.value,
                   self.kimi_linear_ceiling.value, *(f.value for f in self.closest.values()),
                   *(self.memory_ratio(r, n) for r in ROWS for n in CONTEXTS)]
        return {f"{v:.2f}" for v in values}


def compare(row: str, context: int, column: Column) -> Cell:
    """One cell: K3 and the row's other model on the column's deployment and batch."""
    if row not in ROWS:
        raise ValueError(f"unknown row {row!r}; rows: {', '.join(ROWS)}.")
    return Cell(row, context, column, serve("K3", column.deployment, column.batch, context),
                serve(ROWS[row], column.deployment, column.batch, context))


def kv_only_bound(context: int) -> float:
    """The 'same weights, KV only' bound at `context`: the twin's cache traffic per sequence over K3's (KDA state
    read and written), what t(twin) / t(K3) tends to as the batch grows when both read K3's weights."""
    k3, m3 = models()["K3"]
    return kv_only_limit(m3, serving_model(k3, kv_config=k3.twin()), context)


@lru_cache(maxsize=1)
def speedups() -> ServingTable:
    """The table every serving figure reads: rows K3 vs its all-MLA twin and K3 against K2, columns contexts x batch
    1, batch 64 (on the full deployment) and each deployment's largest fitting batch; see the module docstring."""
    cells = []
    for row in ROWS:
        for context in CONTEXTS.values():
            for col in COLUMNS:
                cells.append(compare(row, context, col))
    k3 = models()["K3"][0]
    closest = {}
    for row in ROWS:
        best = max((c for c in cells if c.row == row and c.speedup is not None), key=lambda c: c.speedup)
        closest[row] = Figure(f"{row}: nearest to 'up to 6.3x'", best.speedup, "roofline (this table)",
                              f"{context_name(best.context)}, {best.column.name} (K3 batch {best.k3.batch}, "
                              f"{'twin' if row == 'K3 against twin' else 'K2'} batch {best.other.batch})",
                              "sim.serving.speedups; the claim: S14")
    kl_measured = KIMI_LINEAR_TPOT_MS["full-MLA"] / KIMI_LINEAR_TPOT_MS["Kimi Linear"]
    kl = [serve(n, "64xH200", 1, MIB_CONTEXT) for n in ("Kimi Linear", "Kimi Linear twin")]
    return ServingTable(
        cells=tuple(cells),
        bound=Figure("bound: same weights, KV only", k3.num_layers / len(k3.mla_layers), "bound",
                     f"L / L_MLA = {k3.num_layers} / {len(k3.mla_layers)}: K3's weights and the twin's 93 caches, "
                     "state and weights left out; no batch or context reaches it", "k3_facts.md §5b"),
        kv_only={context: kv_only_bound(context) for context in CONTEXTS.values()},
        closest=closest,
        claim=Figure("'up to 6.3x faster decoding in million-token contexts'", REPORTED_SPEEDUP, "claim",
                     "Moonshot, for Delta Attention; no baseline named", "S14 (via S11, S13); k3_facts.md §0"),
        kimi_linear=Figure("Kimi Linear TPOT, full-MLA baseline / Kimi Linear", kl_measured, "measurement",
                           f"1M context: {KIMI_LINEAR_TPOT_MS['full-MLA']} ms vs {KIMI_LINEAR_TPOT_MS['Kimi Linear']} ms "
                           "per output token", "S16, S34; docs/lineage.md"),
        kimi_linear_model=Figure("Kimi Linear vs its all-MLA twin, this roofline", kl[1].step_s / kl[0].step_s,
                                 "roofline", "1M context, batch 1, bf16 weights", "sim.serving (kimi-linear-48b preset)"),
        kimi_linear_bound=Figure("Kimi Linear bound: same weights, KV only", kimi_linear_kv_only_limit(), "bound",
                                 "1M context, batch -> infinity", "sim.costs.kimi_linear_kv_only_limit"),
        kimi_linear_ceiling=Figure("Kimi Linear bound: L / L_MLA", KIMI_LINEAR.num_layers / len(KIMI_LINEAR.mla_layers),
                                   "bound", f"{KIMI_LINEAR.num_layers} / {len(KIMI_LINEAR.mla_layers)} layers",
                                   "kimi-linear-48b preset (S17)"),
    )


def context_name(context: int) -> str:
    """The name a context length goes by in the tables ("4K", "128K", "1M"), else the count with commas."""
    return next((name for name, n in CONTEXTS.items() if n == context), f"{context:,}")


def crossover(batch: int = 1, dep: str = FULL, same_weights: bool = False) -> int | None:
    """The first context (tokens) from which K3 decodes at least as fast as its twin at `batch` on `dep`
    (both at the same batch, `serve`'s step times). same_weights=True: the labelled bound's twin (K3's own
    weights with 93 caches) instead of the real twin. None when K3 is slower everywhere up to 1M."""
    other = "same-weights twin" if same_weights else "twin"

    def faster(t: int) -> bool:
        return serve("K3", dep, batch, t).step_s <= serve(other, dep, batch, t).step_s

    if not faster(MIB_CONTEXT):
        return None
    if faster(1):
        return 1
    lo, hi = 1, MIB_CONTEXT               # faster(hi), not faster(lo); one change of sign (tests scan for it)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if faster(mid) else (mid, hi)
    return hi


# ---------------------------------------------------------------------------- headline figures (README)


def headline() -> dict[str, float | None]:
    """The few figures quoted in prose: at 1M, batch 1 on the full deployment and the largest fitting batch there."""
    t = speedups()
    big = f"largest fit, {FULL}"
    return {
        "twin_b1_1M": t.speedup("K3 against twin", "1M", "batch 1"),
        "twin_fit_1M": t.speedup("K3 against twin", "1M", big),
        "k2_b1_1M": t.speedup("K3 against K2", "1M", "batch 1"),
        "k2_fit_1M": t.speedup("K3 against K2", "1M", big),
        "twin_b1_4K": t.speedup("K3 against twin", "4K", "batch 1"),
        "k2_b1_4K": t.speedup("K3 against K2", "4K", "batch 1"),
        "bound": t.bound.value,
    }
