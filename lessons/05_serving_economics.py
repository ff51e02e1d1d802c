# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 5 — Serving economics: bytes, GPUs, traffic, dollars
#
# Claims about serving K3 travel fast and lose their sources on the way. This lesson recomputes each
# one from the model itself — parameter counts from the real modules on the `meta` device
# (`tiny_k3.parameter_breakdown`), byte formats and the cost model from `sim.costs` — and checks it
# against its source in k3_facts.md (source ids like S7, S13 are listed at the end of that file).
#
# 1. MXFP4: why K3's weights are **1.56 TB**, not "1.4 TB", and where "594 GB" comes from;
# 2. how many GPUs hold that, with and without long contexts;
# 3. expert-parallel traffic per token, and why latent MoE keeps it at K2's level;
# 4. rent vs own: the API price against a (labelled, optimistic) cost model;
# 5. the seed claims, one by one, with their sources.

# %%
import numpy as np

from checks import check_ep_bytes, check_mxfp4_bytes, check_release_bytes, hint  # noqa: F401  (hint: for you)
from workshop import bar_labels, exercise, integer_ticks, plt, step_slider, try_exercise
from sim.costs import (GPU_MEMORY, K3_PRICES, SCHEMES, api_price, corrections, decode_step_time,
                       expected_destinations, ep_traffic, ep_traffic_for, flops_per_token, k2_parameters,
                       serving_model, packed_bytes, weight_bytes)
from sim.memory import cache_bytes, format_bytes
from tiny_k3 import K3Config, parameter_breakdown, parameter_counts

facts = {}                                 # what the prose below claims, computed here (tests check it)
k3 = K3Config.preset("k3")
parts = parameter_breakdown(k3)            # K3 built on the meta device: real modules, no memory
total, active = parameter_counts(k3)
print(f"K3: {total / 1e12:.4f}T parameters, {parts['routed_experts'] / total:.1%} of them routed experts")

# %% [markdown]
# ## 1. MXFP4 and the size of the checkpoint
#
# MXFP4 (OCP MX, k3_facts.md §4, S27) stores blocks of 32 values as 4-bit E2M1 numbers (16 B) plus one
# shared 8-bit E8M0 scale (1 B): **17 B per 32 values = 4.25 bits**. K3's release quantises only the
# routed experts (config.json: compressed-tensors `mxfp4-pack-quantized`, group 32, S1); attention,
# shared experts, router, projections, embedding and head stay BF16.

# %%
sizes = {scheme: weight_bytes(k3, scheme) for scheme in SCHEMES}
for scheme, n in sizes.items():
    experts, rest = SCHEMES[scheme]
    print(f"{scheme:13s} experts {experts:6s} rest {rest:5s} -> {format_bytes(n, 3)}")
naive = total * 4 / 8
k2_experts, k2_rest = k2_parameters()
k2_thinking = packed_bytes(k2_experts, "int4") + packed_bytes(k2_rest, "bf16")
print(f"\nnaive 'every parameter at 4 bits': {format_bytes(naive, 3)}  <- the '1.4 TB' of the claim (2.8T x 4 bit)")
print(f"K3 release (MXFP4 experts + BF16 rest): {format_bytes(sizes['k3-release'], 3)}  "
      "<- the reported 1.56 TB download (PC Watch via S13; colibri S7)")
print(f"K2-Thinking (INT4 g32 experts + BF16 rest): {format_bytes(k2_thinking, 3)}  <- '594 GB' (S35)")
print(f"594 GB over K3's {total / 1e12:.2f}T parameters = {594e9 * 8 / total:.2f} bit/param: only a 1-bit-class "
      "GGUF fits that (Unsloth UD-IQ1_S, S15)")

fig, ax = plt.subplots(figsize=(12, 3.8))
bars = ax.barh(list(sizes), [n / 1e12 for n in sizes.values()], color="tab:blue")
bar_labels(ax, bars, lambda v: f"{v:.3f} TB", horizontal=True)
for x, label in [(naive / 1e12, "'1.4 TB'"), (0.594, "'594 GB'")]:
    ax.axvline(x, color="crimson", ls="--", lw=1)
    ax.text(x, len(sizes) - 0.4, label, color="crimson", ha="center")
ax.set_xlim(0, max(sizes.values()) / 1e12 * 1.18)
ax.set_xlabel("TB (decimal)"), ax.set_ylabel("storage scheme")
ax.set_title("K3's weights by storage scheme (computed from the meta-device model)")
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 2. GPUs needed
#
# Weights first, then the decode cache (lesson 3): K3 keeps 27,648 B per token of context in its 24 MLA
# layers plus a fixed 449 MB of KDA state per sequence. Here is an *ideal* count — weights and cache
# spread evenly, 10% of each GPU kept for activations and runtime. Real deployments round up to
# parallelism shapes: the smallest published recipes are 8×B300, 16×H200 and 32×H100 (SGLang, S5).

# %%
def gpus(mem, batch=0, context=0, overhead=0.1):
    kv, state = cache_bytes(k3, context, batch=batch) if batch else (0, 0)
    return int(np.ceil((sizes["k3-release"] + kv + state) / (mem * (1 - overhead))))


print(f"{'GPU':5s} {'memory':>7s} {'weights only':>13s} {'+64 seqs x 128K':>16s} {'+16 seqs x 1M':>14s}")
for name, mem in GPU_MEMORY.items():
    print(f"{name:5s} {mem / 1e9:6.0f}G {gpus(mem):>13d} {gpus(mem, 64, 131072):>16d} {gpus(mem, 16, 1 << 20):>14d}")

RECIPES = {"B300": 8, "H200": 16, "H100": 32}     # the smallest SGLang recipes per GPU (S5): 1x8, 2x8, 4x8
contexts = np.logspace(3, 7.5, 60)      # total cached tokens over all sequences (batch x length)
fig, ax = plt.subplots(figsize=(12, 4.2))
for name, mem in GPU_MEMORY.items():
    line, = ax.plot(contexts, [gpus(mem, 1, int(c)) for c in contexts], label=f"{name}: ideal count")
    n = RECIPES[name]
    fits = [c for c in contexts if gpus(mem, 1, int(c)) <= n]      # context the recipe's GPUs can hold
    ax.axhline(n, color=line.get_color(), ls=":", lw=1.2)
    if fits:
        ax.plot(fits[-1], n, "*", ms=14, color=line.get_color())
        ax.annotate(f"SGLang {n}×{name} (S5): up to {fits[-1] / 1e6:.1f}M tokens", (fits[-1], n),
                    textcoords="offset points", xytext=(-10, 6), ha="right", color=line.get_color())
    facts.setdefault("recipe_holds_tokens", {})[name] = float(fits[-1]) if fits else 0.0
ax.set_xscale("log"), ax.set_xlabel("tokens of context held (all sequences)"), ax.set_ylabel("GPUs (ideal)")
ax.set_title("K3 release weights + decode cache; dotted: the published recipes"), ax.legend(loc="upper left")
integer_ticks(ax, "y")
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 3. Expert-parallel traffic
#
# With expert parallelism (EP) each GPU holds E/EP of every layer's experts; a token's activation is
# *dispatched* to the GPUs of its 16 experts and the results are *combined* back (k3_facts.md §6b):
# dispatch in FP8 with a 1-byte scale per 32 values, combine in BF16. Latent MoE dispatches the 3584-wide
# latent, not the 7168-wide hidden state — so K3's 16 copies cost what K2's 8 did.

# %%
sm = serving_model(k3)
for ep in (8, 16, 64):
    t = ep_traffic_for(k3, ep)
    per_gpu = k3.num_experts // ep * len(k3.moe_layers) * sm.expert_bytes
    print(f"EP{ep:<3d}: {k3.num_experts // ep:3d} experts/GPU/layer = {format_bytes(per_gpu)} of MXFP4 experts per GPU; "
          f"a token reaches {t.destinations:4.1f} GPUs per layer; {format_bytes(t.per_token)} per token over "
          f"{t.moe_layers} MoE layers")
k2 = ep_traffic(7168, 8, 64, 60)
print(f"K2 (d_route 7168, top-8, 60 MoE layers): {format_bytes(k2.per_layer)} per layer, "
      f"K3: {format_bytes(ep_traffic_for(k3).per_layer)} — the same per layer")

eps = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256])
fig, ax = plt.subplots(figsize=(10, 3.8))
for k, label in [(16, "K3: top-16"), (8, "K2 / DeepSeek-V3: top-8")]:
    ax.plot(eps, [expected_destinations(int(e), k) for e in eps], "o-", label=label)
ax.plot(eps, eps, "k:", lw=0.8, label="EP (every GPU)")
ax.set_xscale("log", base=2), ax.set_ylim(0, 17), ax.set_xlabel("EP degree (GPUs holding experts)")
ax.set_ylabel("distinct GPUs per token"), ax.legend()
ax.set_title("EP·(1 − (1 − 1/EP)^k): one copy per destination GPU")
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 4. Rent vs own
#
# The API price (k3_facts.md §1: S11, S12, S13): **$3.00** per million input tokens on a cache miss,
# **$0.30** on a cache hit, **$15.00** per million output tokens.

# %%
req = dict(input_tokens=100_000, output_tokens=2_000, cached_tokens=80_000)
print(f"one agent turn, 100K context (80K cached) + 2K output: ${api_price(**req):.4f} "
      f"(input {K3_PRICES['input']}/{K3_PRICES['cache_hit']} $/M, output {K3_PRICES['output']} $/M)")

# %% [markdown]
# Owning (or renting GPUs by the hour) is priced per *GPU-hour*, so it pays only if the GPUs stay busy.
# A rough model, **with its assumptions in plain sight** (edit them):
#
# * 16 H200s (the smallest H200 recipe, S5) at **$2 per GPU-hour** (the figure DeepSeek used for its own cost
#   accounting, S23);
# * decode is bandwidth bound: 4.8 TB/s per GPU at 70% efficiency, no communication (k3_facts.md §5b —
#   optimistic);
# * prefill (the input tokens) is compute bound: FLOPs from `sim.costs.flops_per_token`, on 989 TFLOP/s of
#   dense BF16 per H200 (NVIDIA's datasheet figure) at 40% utilisation; tokens the API bills as cache hits
#   are not recomputed.
#
# Two views: output tokens alone against the API's $15/M, then a whole agent turn, input priced as well.

# %%
GPU_HOUR = 2.0           # $ per GPU-hour — an assumption, edit me
G = 16                   # H200s (S5's smallest H200 recipe)
PEAK_FLOPS, MFU = 989e12, 0.4    # per H200, dense BF16; the fraction prefill achieves — assumptions
per_gpu_second = GPU_HOUR / 3600
batches = np.unique(np.logspace(0, 10, 81, base=2).round().astype(int))


def crossing(costs, price):
    """The smallest batch at which owning costs no more than the API (None if it never does)."""
    below = np.nonzero(np.asarray(costs) <= price)[0]
    return int(batches[below[0]]) if below.size else None


fig, (a1, a2) = plt.subplots(1, 2, figsize=(15, 4.6))
for context in (4096, 131072):
    step = np.array([decode_step_time(sm, int(b), context, gpus=G, bandwidth=4.8e12) for b in batches])
    dollars = G * per_gpu_second * step / batches * 1e6          # $ per million output tokens
    line, = a1.plot(batches, dollars, "-", label=f"own: {G}×H200, {context // 1024}K context")
    cross = crossing(dollars, K3_PRICES["output"])
    facts[f"output_crossing_{context // 1024}K"] = cross
    if cross:
        a1.axvline(cross, color=line.get_color(), ls=":", lw=1.2)
        a1.annotate(f"batch {cross}", (cross, K3_PRICES["output"]), textcoords="offset points", xytext=(4, 8),
                    color=line.get_color())
    print(f"output only, {context // 1024:4d}K context: batch 1 -> ${dollars[0]:.1f}/M; owning is cheaper than "
          f"the API's ${K3_PRICES['output']:.0f}/M from batch {cross} on")
a1.axhline(K3_PRICES["output"], color="crimson", ls="--", label="API: $15 per M output tokens")
a1.set_xscale("log", base=2), a1.set_yscale("log"), a1.set_xlabel("sequences decoded together (batch)")
a1.set_ylabel("$ per M output tokens (log)"), a1.set_title("output tokens only (decode)")
a1.legend(loc="upper right")

# one agent turn: a 100K-token context of which 80K hit the prefix cache, 2K tokens written
turn = dict(input_tokens=100_000, output_tokens=2_000, cached_tokens=80_000)
new_tokens = turn["input_tokens"] - turn["cached_tokens"]
prefill_flops = sum(flops_per_token(k3, context=c) for c in range(turn["cached_tokens"], turn["input_tokens"], 1000)) * 1000
prefill_s = prefill_flops / (G * PEAK_FLOPS * MFU)           # the G GPUs busy on this turn's prefill
decode_s = np.array([turn["output_tokens"] * decode_step_time(sm, int(b), turn["input_tokens"], gpus=G,
                                                              bandwidth=4.8e12) / b for b in batches])
own_turn = G * per_gpu_second * (prefill_s + decode_s)       # $ per turn
api_turn = api_price(**turn)
api_input = api_price(turn["input_tokens"], 0, turn["cached_tokens"])
cross_turn = crossing(own_turn, api_turn)
facts.update(turn_crossing=cross_turn, api_turn=api_turn, api_input=api_input, api_input_share=api_input / api_turn,
             own_prefill=G * per_gpu_second * prefill_s)
a2.plot(batches, own_turn, "-", color="tab:blue", label="own: prefill + decode")
a2.plot(batches, np.full_like(own_turn, G * per_gpu_second * prefill_s), ":", color="tab:blue",
        label="own: prefill alone")
a2.axhline(api_turn, color="crimson", ls="--", label=f"API: ${api_turn:.3f} per turn")
a2.axhline(api_input, color="crimson", ls=":", label=f"API: its input part, ${api_input:.3f}")
if cross_turn:
    a2.axvline(cross_turn, color="k", ls=":", lw=1.2)
    a2.annotate(f"batch {cross_turn}", (cross_turn, api_turn), textcoords="offset points", xytext=(4, 8))
a2.set_xscale("log", base=2), a2.set_yscale("log"), a2.set_xlabel("sequences decoded together (batch)")
a2.set_ylabel("$ per agent turn (log)"), a2.set_title("one agent turn: 100K in (80K cached), 2K out")
a2.legend(loc="upper right")
plt.tight_layout(); plt.show()
print(f"agent turn: API ${api_turn:.4f}, of which input ${api_input:.4f} ({api_input / api_turn:.0%}); "
      f"owning: prefill ${G * per_gpu_second * prefill_s:.4f} ({prefill_s:.2f} s on {G} GPUs) + decode, "
      f"cheaper than the API from batch {cross_turn} on")

# %% [markdown]
# Read the two panels together. On output tokens alone the crossing (marked) comes at a small batch — the
# $15/M output price is high against a bandwidth-bound decode that many sequences share. A real agent turn is
# mostly *input*: most of what the API bills for it is the input (the dotted red line), while owning pays for
# the input in prefill compute — and in this model that compute (the dotted blue line) costs less than the
# API's input price, so the whole turn crosses no later than output alone (the printed batch). Change
# `MFU`, `GPU_HOUR` or the turn and watch the crossings move. All of it is before communication, idle hours,
# failed requests and engineers; every step reads the active weights once, whatever the batch
# (k3_facts.md §5b), so keeping the batch full is everything:

# %%
from sim.costs import decode_step_bytes, expected_experts_touched  # noqa: E402

for batch in (1, 64):
    read = decode_step_bytes(sm, batch, 0)          # weights only (no cache at context 0)
    touched = expected_experts_touched(k3.num_experts, k3.top_k, batch)
    print(f"batch {batch:2d}: one step reads {format_bytes(read['dense'] + read['experts'])} of weights "
          f"(BF16 non-expert {format_bytes(read['dense'])} + {touched:.0f} MXFP4 experts per layer) "
          f"= {format_bytes((read['dense'] + read['experts']) / batch)} per token")

# %% [markdown]
# ## 5. The seed claims, checked
#
# `sim.costs.corrections()` recomputes the four corrections of k3_facts.md §0. Step through them:

# %%
claims = corrections()


def show_step(i):
    c = claims[i]
    print(f"CLAIM {i + 1}/{len(claims)}: {c['claim']}   [sources: {', '.join(c['sources'])}]")
    print(f"  {c['verdict']}")
    for name, value in c["figures"].items():
        shown = (format_bytes(value, 3) if name.endswith("(B)") else f"{value:.2f}" if isinstance(value, float)
                 else str(value))
        print(f"    {name}: {shown}")


step_slider(show_step, len(claims), description="claim")

# %%
for i in range(len(claims)):
    show_step(i)
    print()

# %% [markdown]
# ## Exercises
#
# ### Exercise 5.1 — MXFP4 bytes of one weight matrix (★☆☆, about 6 min)
# Blocks of 32 along each row, 16 B of 4-bit values + a 1-B scale per block; a short last block is padded.

# %% tags=["exercise"]
@exercise("mxfp4_bytes")
def my_mxfp4_bytes(rows, cols):
    """A [rows, cols] matrix in MXFP4 -> bytes (int)."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_mxfp4_bytes, my_mxfp4_bytes)

# %% [markdown]
# ### Exercise 5.2 — the size of K3's release (★★☆, about 8 min)
# Routed experts in MXFP4, everything else in BF16, from the parameter breakdown.

# %% tags=["exercise"]
@exercise("release_bytes")
def my_release_bytes(parts):
    """parts: parameter_breakdown(config) -> bytes of the release format (int)."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_release_bytes, my_release_bytes)

# %% [markdown]
# ### Exercise 5.3 — expert-parallel bytes per token per layer (★★☆, about 10 min)
# Dispatch (FP8 + scales) and combine (BF16) for each of the top-k copies — of which activation?

# %% tags=["exercise"]
@exercise("ep_bytes")
def my_ep_bytes(config):
    """config: a K3Config -> all-to-all bytes per token per MoE layer (int)."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_ep_bytes, my_ep_bytes)

# %% [markdown]
# **Take-away.** K3's memory bill is its 1.56 TB of weights (MXFP4 experts, BF16 rest) plus the cache;
# its per-token bill is the ≈137 GB of active weights each decode step reads, shared by everything in
# the batch. Latent MoE keeps expert-parallel traffic at K2's level despite twice the top-k. Every
# figure above is recomputed, and every claim carries its source.

# %% [markdown]
# ## Measure it yourself
#
# Everything above is a *model*. `sim.measure` times the real thing: one layer of each kind at K3's real
# widths — a KDA layer, a gated MLA layer with a latent cache of T tokens read in the absorbed form
# (kv_lora_rank + qk_rope_dim values per token, `mla.md §2`), a latent MoE layer with only the 16 + 2 experts one step
# touches, the dense first layer and the LM head — with random weights, one at a time, then composes them
# by the schedules: K3 = 69 KDA + 24 MLA + 92 MoE + dense + head, its all-MLA twin = 93 MLA + the same,
# and a K2-shaped model = 61 K2 MLA + 60 K2 MoE + K2's dense layer + head (docs/k2_config.md).
#
# On your laptop: `python -m sim measure --quick --save` (a few minutes; the full run goes to 1M tokens),
# or set `MEASURE_HERE = True` below. The lesson reads your saved measurement, else the one shipped in
# `bench/results/shipped/` (taken on the project's 2-core machine while other jobs ran), and runs the same
# code at tiny widths (`tiny=True`) to show that it works.

# %%
from sim.measure import ACCELERATORS, REPORTED_SPEEDUP, SHIPPED, load_saved, measure, reading  # noqa: E402

MEASURE_HERE = False       # True: measure this machine at real widths (--quick settings, a few minutes)
check = measure((64, 256), tiny=True, quick=True)    # K3's topology at tiny widths: seconds, numbers mean nothing
print(f"tiny-width check: K3 {1e3 * check.per_token('k3', 256):.1f} ms/token = "
      + " + ".join(f"{n} x {layer}" for layer, n in check.schedules["k3"].items()))
if MEASURE_HERE:
    m, whose = measure(quick=True), "yours, just now"
elif load_saved() is not None:
    m, whose = load_saved(), "yours, saved by `python -m sim measure --save`"
elif SHIPPED.is_file():
    m, whose = load_saved(SHIPPED), "shipped: the project's machine, under load from other jobs"
else:
    m, whose = check, "the tiny-width check (no saved measurement found)"
print(f"measurement ({whose}): {m.widths} widths on {m.device_name}, {m.dtype}, {m.machine.threads} threads, {m.created}; "
      f"copy {m.machine.bandwidth / 1e9:.1f} GB/s, GEMM {m.machine.flops / 1e9:.0f} GFLOP/s")
print("one layer of each kind, weights: " + ", ".join(f"{layer} {w.weights / 1e9:.3f}B" for layer, w in m.work.items()))

# %%
T = np.array(m.tokens)
grid = np.unique(np.logspace(10, 20, 41, base=2).astype(int))    # the roofline is analytic: 1K..1M whatever was timed
fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 4.4))
for model, label in [("k3", "K3 (hybrid)"), ("twin", "all-MLA twin"), ("k2", "K2-shaped")]:
    a1.plot(T, [m.per_token(model, int(t)) for t in T], "o-", label=label)
a1.set_xscale("log"), a1.set_yscale("log"), a1.set_xlabel("cached tokens T"), a1.set_ylabel("s per token, measured")
a1.set_title(f"decode on {m.device} ({m.dtype})"), a1.legend(fontsize=9)

keys = [k for k in m.seconds if "@" not in k] + [f"mla@{T[-1]}", f"k2-mla@{T[-1]}"]
frac = np.array([m.fractions(k) for k in keys])
x = np.arange(len(keys))
a2.bar(x - 0.2, frac[:, 0], 0.4, label="of copy bandwidth"), a2.bar(x + 0.2, frac[:, 1], 0.4, label="of GEMM FLOP/s")
a2.set_xticks(x, [k.replace("@", " @") for k in keys], fontsize=9, rotation=60, ha="right")
a2.set_ylabel("achieved fraction")
a2.set_title("each step vs this machine's peaks"), a2.legend(fontsize=9)

for acc in ACCELERATORS:
    a3.plot(grid, [m.roofline_speedup(int(t), acc.bandwidth, acc.bf16_flops) for t in grid], lw=1, label=f"{acc.name} roofline")
a3.plot(grid, [m.bandwidth_speedup(int(t)) for t in grid], "k:", lw=1, label="bandwidth model")
a3.plot(T, [m.speedup(int(t)) for t in T], "ko-", label="measured here")
for y, label in [(REPORTED_SPEEDUP, f"reported {REPORTED_SPEEDUP:g}x"), (93 / 24, "93/24 ceiling")]:
    a3.axhline(y, color="crimson" if y == REPORTED_SPEEDUP else "grey", ls="--", lw=0.8)
    a3.text(grid[0], y, label, fontsize=9, va="bottom")
a3.set_xscale("log"), a3.set_xlabel("cached tokens T"), a3.set_ylabel("twin / K3 per-token time")
a3.set_title("K3's speed-up over its all-MLA twin"), a3.legend(fontsize=9)
plt.tight_layout(); plt.show()

# %% [markdown]
# **The honest reading**, computed from the measurement above (`sim.measure.reading`): whether the MLA step
# is bandwidth- or compute-bound depends on the machine's FLOP/byte balance (its *ridge*), and where K3 starts
# beating its twin depends on how much the KDA layers' extra weights cost against the MLA cache they save.

# %%
for line in reading(m):
    print("•", line)
h200 = next(a for a in ACCELERATORS if a.name == "H200")
wins = [int(t) for t in grid if m.roofline_speedup(int(t), h200.bandwidth, h200.bf16_flops) > 1]
kda, mla = m.work["kda"], m.work["mla"]
print(f"• In bf16 one KDA layer moves {format_bytes(kda.bytes_at(0, 2))} per step, one MLA layer "
      f"{format_bytes(mla.bytes_at(0, 2))} plus {mla.cache_width * 2} B per cached token, so on the H200 roofline K3 "
      + (f"overtakes its twin from about {wins[0]:,} cached tokens" if wins else "never overtakes its twin in this range")
      + f" and reaches {m.roofline_speedup(int(grid[-1]), h200.bandwidth, h200.bf16_flops):.2f}x at {grid[-1]:,}: "
      f"far from {REPORTED_SPEEDUP:g}x, which compares Kimi Linear with a full-MLA model (k3_facts.md §0).")
n = m.tokens[-1]
facts.update(measure_schedule_k3=check.schedules["k3"], measure_schedule_twin=check.schedules["twin"],
             measure_check_sum=check.per_token("k3", 256) - sum(check.parts("k3", 256).values()),
             measure_tokens=n, measure_speedup=m.speedup(n), measure_bandwidth_model=m.bandwidth_speedup(n),
             measure_h200_roofline_1M=m.roofline_speedup(int(grid[-1]), h200.bandwidth, h200.bf16_flops),
             measure_h200_overtakes_from=wins[0] if wins else None, measure_ceiling=93 / 24)
