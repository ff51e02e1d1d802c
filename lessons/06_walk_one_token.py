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
# # Lesson 6 — Walk one token through tiny K3
#
# The capstone. One token goes in at the embedding; it passes every sublayer — KDA or gated MLA
# attention, then a dense MLP or the latent MoE, each reading its input through Attention Residuals —
# and comes out as next-token probabilities. The simulator records all of it in a `Frame`, and
# `Simulation.step_into(i)` walks frame i's sublayers in execution order. Everything from lessons 1–4
# shows up at its own stop:
#
# | stop | what you see | lesson |
# |---|---|---|
# | every sublayer | its depth-attention read over the embedding and the block sums | 4 |
# | KDA attention | the fixed K × V state per head, its per-channel decay and β | 2 |
# | gated MLA attention | what it attends to over the cached tokens; a cache that grows by one latent per token | 3 |
# | latent MoE | 16 of 896 experts, their weights | 1 |
# | embedding | the token's vector, the first depth source | — |
# | head | the five most likely next tokens | — |
#
# Open the TUI beside this notebook with the same preset, prompt and seed (`python tui.py --preset small
# --seed 0`; the TUI's default prompt is this lesson's) and you will see the same frames.

# %%
import numpy as np
import torch
from rich.console import Console

from checks import check_num_sources, check_sublayer_order, hint  # noqa: F401  (hint: for you)
from figures import depth_grid
from workshop import (expected_answer, exercise, heatmap, integer_ticks, plt, step_slider, trace,
                      try_exercise)
from sim import Simulation
from sim import render
from sim.memory import cache_bytes
from tiny_k3 import DEFAULT_PROMPT
from tiny_k3.tokenizer import token_text

facts = {}                         # what the prose below claims, measured here (tests/test_lessons.py checks it)
prompt = DEFAULT_PROMPT
sim = Simulation("small", prompt, seed=0)    # weights="auto": trained when shipped, else random
sim.run(6)
cfg = sim.config
print(sim)
print(f"text so far: {sim.text!r}")
print(f"{cfg.num_layers} layers: {' '.join(k.upper() for k in cfg.layer_kinds)}; dense MLP in the first "
      f"{cfg.first_k_dense}, latent MoE ({cfg.num_experts} experts, top-{cfg.top_k}) after; Block AttnRes, "
      f"{cfg.attnres_block_size} sublayers per block")
if sim.weights == "random":
    print("(random weights: the route through the model is real, the generated text is noise)")

# %% [markdown]
# **Did it answer right?** The prompt is written in the language of the training corpus (`tiny_k3.corpus`),
# so it has a right answer. The model's answer is the first generated token:

# %%
generated = sim.text[len(prompt):]                  # what the model wrote after the prompt
right = expected_answer(prompt)
answer = generated[: len(right)] if right else generated[:1]
facts.update(prompt=prompt, answer=answer, expected=right, answer_right=answer == right)
verdict = "right" if answer == right else "WRONG"
print(f"prompt {prompt!r}: the model continues {generated!r}, so it answers {answer!r}; the right answer is "
      f"{right!r} — {verdict}")
if answer != right:
    print("A tiny model trained for minutes is wrong sometimes. Section 6 forces the right answer and "
          "regenerates from there.")

# %% [markdown]
# ## 1. The timeline and one frame
#
# Frame i processes the input token at position i; `frame.token_id` is the token that follows it. We
# walk the **last prompt token** — the one whose logits chose the first generated token.

# %%
i = sim.prompt_len - 1
frame = sim.frames[i]
stops = sim.step_into(i)
print(f"frame {i}: input {frame.input_text!r} -> next {frame.token_text!r}; {len(stops)} stops")
for s in stops:
    extra = ""
    if s.depth is not None and s.depth.weights.size:
        extra += f"  reads {s.depth.weights.size} sources"
    if s.kda is not None:
        extra += f"  ‖S‖ per head {np.round(s.kda.state_norm, 3)}"
    if s.routing is not None:
        extra += f"  experts {s.routing.expert_ids[:4].tolist()}…"
    if s.top:
        extra += f"  top: {', '.join(f'{t}:{p:.3f}' for _, t, p in s.top[:3])}"
    print(f"{s.index:3d} {s.label:18s} out RMS {s.out_norm:.4f}{extra}")

# %% [markdown]
# ## 2. The token's passport
#
# Left: how much each sublayer wrote (RMS of its output), coloured by kind. Right: every depth read of
# this token — rows are the sublayers (and the head), columns the sources: the embedding, the completed
# block sums, and last, whenever the current block has started, its partial sum.

# %%
colors = {"embed": "grey", "kda": "tab:green", "mla": "tab:red", "dense": "tab:purple", "moe": "tab:blue",
          "head": "black"}
reads = [s for s in stops if s.depth is not None and s.depth.weights.size]
grid, columns = depth_grid([(s.layer, s.depth.site, s.depth.weights) for s in reads], cfg.attnres_block_size,
                           cfg.num_layers)

fig, (a1, a2) = plt.subplots(1, 2, figsize=(16, 6), gridspec_kw={"width_ratios": [1.4, 1]})
a1.bar(range(len(stops)), [s.out_norm for s in stops], color=[colors[s.kind] for s in stops])
a1.set_xticks(range(len(stops)), [s.label for s in stops], rotation=70, ha="right")
a1.set_yscale("log"), a1.set_ylabel("RMS written to the stream (log)")
a1.set_title(f"frame {i}: {frame.input_text!r} through every sublayer")
from matplotlib.patches import Patch  # noqa: E402

kinds_here = list(dict.fromkeys(s.kind for s in stops))                 # the kinds on this token, in order
a1.legend(handles=[Patch(color=colors[k], label=k if k in ("embed", "head") else k.upper()) for k in kinds_here],
          loc="upper center", bbox_to_anchor=(0.5, -0.42), ncol=len(kinds_here), title="sublayer kind")
heatmap(a2, grid, label="depth weight α (rows sum to 1)", vmin=0, vmax=1, cmap="viridis", xlabel="source")
a2.set_yticks(range(len(reads)), [s.label for s in reads])
a2.set_xticks(range(len(columns)), columns)
a2.set_title("depth weights (AttnRes)")
plt.tight_layout(); plt.show()

# %% [markdown]
# The bars are on a log scale because the sublayers' writes differ by orders of magnitude. Compare the two
# kinds of attention layer:

# %%
def mean_write(kind):
    return float(np.mean([s.out_norm for s in stops if s.kind == kind]))


writes = {kind: mean_write(kind) for kind in ("kda", "mla", "dense", "moe")}
facts.update(mla_write_rms=[s.out_norm for s in stops if s.kind == "mla"], writes=writes)
ratio = writes["kda"] / writes["mla"]
print("mean RMS written: " + ", ".join(f"{k.upper()} {v:.4f}" for k, v in writes.items()))
print(f"the MLA layers write {ratio:.0f}x {'less' if ratio > 1 else 'more'} than the KDA layers on this token"
      if ratio >= 2 or ratio <= 0.5 else "the MLA and KDA layers write about as much on this token")

# %% [markdown]
# **Question for you.** What a sublayer writes is all it contributes: a layer that writes almost nothing
# changes nothing downstream. If the MLA layers write much less than the KDA layers here, what does that say
# about what this model uses them for on this prompt? Look at their attention pattern in the next section
# (what do they attend to?) and think about which tokens this prompt needs to look far back for. (Lesson 3's
# recall-vs-distance discussion is the other half of the answer.)

# %% [markdown]
# ## 3. Step into the token
#
# `show_step(j)` draws stop j with what matters there: the token's embedding, the KDA state and its decay,
# what an MLA layer attends to over the cached tokens, the MoE's experts, the head's top five. The frames do
# not keep MLA attention weights, so we trace the same tokens once through the same model to get them
# (`workshop.trace`, the real decode path, one token at a time).

# %%
in_ids = [f.input_id for f in sim.frames[: i + 1]]
_, traced = trace(sim.model, in_ids)
mla_probs = {layer: d["probs"][0, :, 0].float().numpy() for layer, d in traced[-1].of("mla")}   # [H, S]
with torch.no_grad():
    embedding = sim.model.embed.weight[frame.input_id].float().numpy()
labels = [repr(token_text(t))[1:-1] or "·" for t in in_ids]


def show_step(j, frame_index=i):
    s = sim.step_into(frame_index)[j]
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.2), gridspec_kw={"width_ratios": [1.3, 1]})
    title = f"stop {j}: {s.label}"
    if s.kind == "embed":
        axes[0].bar(range(embedding.size), embedding, color="grey")
        axes[0].set_xlabel("channel"), axes[0].set_ylabel("value"), integer_ticks(axes[0], "x")
        axes[0].set_title(f"{title} — the token's embedding row (RMS {s.out_norm:.3f})")
        axes[1].hist(embedding, bins=20, color="grey"), axes[1].set_xlabel("value"), axes[1].set_ylabel("channels")
        axes[1].set_title("b_0, the first depth source of every read")
    elif s.kind == "kda":
        head = 0
        heatmap(axes[0], s.kda.state[head].astype(np.float32), label="S entry", diverging=True,
                xlabel="value channel", ylabel="key channel")
        axes[0].set_title(f"{title} — state S, head {head} (K×V)")
        axes[1].bar(range(s.kda.decay.shape[1]), s.kda.decay[head], color="tab:green")
        axes[1].set_ylim(0, 1), axes[1].set_xlabel("key channel"), axes[1].set_ylabel("α = exp(g)")
        axes[1].set_title(f"decay per key channel; β = {s.kda.beta[head]:.3f}"), integer_ticks(axes[1], "x")
    elif s.kind == "mla":
        probs = mla_probs[s.layer]
        heatmap(axes[0], probs, label="attention weight (row sums to 1)", vmin=0, vmax=float(probs.max()),
                cmap="Reds", xlabel="cached token", ylabel="head")
        axes[0].set_xticks(range(len(labels)), labels), integer_ticks(axes[0], "y")
        for tick in axes[0].get_xticklabels():
            tick.set_rotation(90 if len(tick.get_text()) > 1 else 0)     # '<bos>' upright covers its neighbour
        uniform, peak = 1 / probs.shape[1], np.unravel_index(np.argmax(probs), probs.shape)
        axes[0].set_title(f"{title} — what {frame.input_text!r} attends to: peak {probs.max() / uniform:.1f}× "
                          f"uniform ({uniform:.3f}), on {labels[peak[1]]!r}")
        mem = sim.frames[frame_index].memory
        mla = list(cfg.mla_layers)
        axes[1].bar([f"L{m}" for m in mla], [mem.layer_bytes[m] for m in mla], color="tab:red")
        axes[1].set_ylabel("bytes cached"), axes[1].set_xlabel("MLA layer")
        axes[1].set_title(f"{cfg.mla_cache_width} values per token; {frame_index + 1} tokens so far")
    elif s.kind == "moe":
        r = s.routing
        heatmap(axes[0], r.scores.reshape(16, -1), label="router score s", vmin=0, vmax=1, cmap="Greys",
                xlabel="expert id mod 56", ylabel="expert id // 56")
        rows, cols = np.divmod(r.expert_ids, r.scores.size // 16)
        axes[0].scatter(cols, rows, c="crimson", s=30, marker="s"), integer_ticks(axes[0], "both")
        axes[0].set_title(f"{title} — {r.expert_ids.size} of {r.scores.size} experts")
        axes[1].bar(range(r.expert_ids.size), r.weights, color="crimson")
        axes[1].set_xticks(range(r.expert_ids.size), [str(e) for e in r.expert_ids], rotation=90)
        axes[1].set_xlabel("chosen expert"), axes[1].set_ylabel("weight"), axes[1].set_title("weights (sum 1)")
    elif s.kind == "head":
        axes[0].barh([repr(t) for _, t, _ in s.top][::-1], [p for _, _, p in s.top][::-1], color="black")
        axes[0].set_xlabel("probability"), axes[0].set_title(f"{title} — next-token probabilities")
        axes[1].bar(range(s.depth.weights.size), s.depth.weights), axes[1].set_title("final depth read")
        axes[1].set_xlabel("source (emb, b1, …)"), axes[1].set_ylabel("α"), integer_ticks(axes[1], "x")
    else:
        axes[0].bar(range(s.depth.weights.size), s.depth.weights, color=colors[s.kind])
        axes[0].set_xlabel("source (emb, b1, …, partial)"), axes[0].set_ylabel("α"), integer_ticks(axes[0], "x")
        axes[0].set_title(f"{title} — depth weights of its input")
        axes[1].bar(["this sublayer"], [s.out_norm], color=colors[s.kind]), axes[1].set_ylabel("RMS written")
        axes[1].set_title(f"{s.kind}: what it writes to the stream")
    plt.tight_layout(); plt.show()


step_slider(show_step, len(stops), start=1, description="stop")

# %%
first = {kind: next(s.index for s in stops if s.kind == kind) for kind in ("embed", "kda", "mla", "moe", "head")}
for kind, j in first.items():       # one stop of each kind, without the slider
    show_step(j)

# %% [markdown]
# ## 4. Lessons 1–4, checked on this very frame
#
# The frame is plain data, so every claim of the earlier lessons can be checked on it:

# %%
moe = next(s for s in stops if s.kind == "moe")
r = moe.routing
biased_top = np.sort(np.argsort(r.scores + r.bias)[-cfg.top_k:])
print(f"L1  routing at {moe.label}: ids == topk(s + b): {np.array_equal(np.sort(r.expert_ids), biased_top)}; "
      f"weights == s[ids]/Σ: {np.allclose(r.weights, r.scores[r.expert_ids] / r.scores[r.expert_ids].sum())}")
kda = next(s for s in stops if s.kind == "kda")
print(f"L2  KDA at {kda.label}: state {kda.kda.state.shape} per head; decay in "
      f"[{kda.kda.decay.min():.3f}, {kda.kda.decay.max():.3f}]; delta-rule write ‖ΔS‖ per head "
      f"{np.round(kda.kda.correction_norm, 4)}")
kv, state = cache_bytes(cfg, frame.position + 1)
print(f"L3  memory after {frame.position + 1} tokens: KV {frame.memory.kv_bytes} B (formula {kv}), state "
      f"{frame.memory.state_bytes} B (formula {state}), twin {frame.memory.twin_kv_bytes} B")
print(f"L4  depth reads: {len(reads)}, every row sums to 1: {np.allclose(np.nansum(grid, 1), 1)}; sources per read "
      f"{[s.depth.weights.size for s in reads]}")

# %% [markdown]
# ## 5. The TUI's view of the same frame
#
# The TUI draws with `sim.render` — Rich renderables that also print in a notebook. The 896-expert grid
# as the terminal shows it (half blocks, 56 × 16), and the memory bars:

# %%
console = Console(width=120)
console.print(render.expert_grid(r, cfg.num_experts))
console.print(render.memory_bars(frame, cfg))

# %% [markdown]
# ## 6. Back and branch
#
# Going back costs nothing (frames are kept); generating something different from an earlier point
# *branches*: the simulator restores the decode state saved there — a KDA state is a fixed-size copy, an
# MLA cache is simply truncated — and regenerates. We force the first answer token to one the model did
# **not** choose: the right answer if the model got it wrong, else its runner-up.

# %%
before = sim.text                  # what the model generated on its own
sim.goto(sim.prompt_len - 1)
last_prompt = sim.frames[sim.prompt_len - 1]
model_choice = last_prompt.token_text
runner_up = next(token_text(int(t)) for t in last_prompt.top_ids if token_text(int(t)) != model_choice)
forced = right if right is not None and right[:1] != model_choice else runner_up
forced = forced[:1]                # one byte = one token
sim.step(force_token=forced)       # replaces the model's own choice
sim.run(3)
facts.update(model_choice=model_choice, forced=forced, before=before, branch=sim.text)
print(f"the model chose {model_choice!r}; forced {forced!r}")
print(f"before: {before!r}\nbranch: {sim.text!r}")
print(f"bytes kept for branching (KDA snapshots): {sim.snapshot_bytes():,} B")

# %% [markdown]
# ## Exercises
#
# ### Exercise 6.1 — the route of a token (★☆☆, about 6 min)
# List the stops one token passes, for any config: "embed", then per layer its attention kind
# ("kda"/"mla") and its MLP kind ("dense"/"moe"), then "head".

# %% tags=["exercise"]
@exercise("sublayer_order")
def my_sublayer_order(config):
    """config: a K3Config -> ['embed', 'kda', 'dense', ..., 'head']."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_sublayer_order, my_sublayer_order)

# %% [markdown]
# ### Exercise 6.2 — how many sources does a sublayer read? (★★★, about 10 min)
# Predict the length of each depth read (lesson 4) from the config alone.

# %% tags=["exercise"]
@exercise("num_sources")
def my_num_sources(config, layer, site):
    """config: a K3Config with residual 'block' or 'full', layer: int, site: 'attn' | 'mlp' | 'out' -> int."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_num_sources, my_num_sources)

# %% [markdown]
# **Take-away.** One token, one walk: a depth read before every sublayer, a fixed-size KDA memory in
# three of four attention layers, a growing latent cache in the fourth, 16 of 896 experts in every MoE
# layer, and a head that turns it all into the next token. The simulator keeps every step so you can go
# back, look again, and branch.

# %% [markdown]
# ## What K3 changed
#
# K3 grew out of two predecessors that the same config language can write down: **Kimi K2** (DeepSeek-V3's
# architecture: every layer MLA with RoPE, a plain MoE at full width) and **Kimi Linear** (the KDA + MLA
# hybrid K3 took its attention from). `tiny_k3.lineage.diff` compares two presets part by part, counted from
# the real modules on the meta device; `python -m tiny_k3 diff k2 k3` prints the same (sources in
# docs/lineage.md).

# %%
from tiny_k3 import K3Config
from tiny_k3.lineage import diff


def show_diff(predecessor: str, successor: str = "k3") -> dict:
    """Print the parts that changed from `predecessor` to `successor`; return every row by part."""
    rows = {row.part: row for row in diff(K3Config.preset(predecessor), K3Config.preset(successor))}
    print(f"{predecessor} -> {successor}")
    for row in rows.values():
        if row.changed and row.part not in ("total parameters", "active per token"):
            delta = f"  [{row.delta:+,}{' B' if row.unit == 'bytes' else ''}]" if row.unit and row.delta else ""
            print(f"  {row.part:20s} {row.before}\n  {'':20s} -> {row.after}{delta}")
    total, active = rows["total parameters"], rows["active per token"]
    print(f"  parameters {total.size_before / 1e9:,.1f}B -> {total.size_after / 1e9:,.1f}B, active "
          f"{active.size_before / 1e9:,.1f}B -> {active.size_after / 1e9:,.1f}B")
    return rows


k2_rows = show_diff("k2")

# %%
kimi_linear_rows = show_diff("kimi-linear-48b")

# %%
k2_config, k3_config = K3Config.preset("k2"), K3Config.preset("k3")
kv, state = k2_rows["KV cache per token"], k2_rows["KDA state per sequence"]
print(f"Against K2, K3 keeps a growing cache in {len(k3_config.mla_layers)} of {k3_config.num_layers} layers "
      f"instead of all {k2_config.num_layers}: {1 - kv.size_after / kv.size_before:.1%} fewer KV bytes per token, "
      f"for a fixed {state.size_after / 1e6:,.0f} MB of KDA state per sequence. Its experts read a "
      f"{k3_config.latent_dim}-wide latent instead of the {k3_config.hidden_size}-wide stream, so each token can go "
      f"to {k3_config.top_k} of {k3_config.num_experts} experts where K2 sent it to {k2_config.top_k} of "
      f"{k2_config.num_experts}.")
import dataclasses  # noqa: E402

kimi_linear = K3Config.preset("kimi-linear-48b")
changed = [row.part for row in kimi_linear_rows.values() if row.changed and row.unit != "bytes"
           and row.part not in ("total parameters", "active per token")]
# Every part above changed size (K3 is ~57x Kimi Linear); what changed in KIND is a short list of config switches.
# Each switch that differs must be named here, so the sentence cannot fall behind the presets.
DESIGN_SWITCHES = {
    "moe_kind": "the MoE became latent (experts read a narrower latent, not the stream)",
    "kda_gate_lower_bound": "KDA's decay gate became bounded, g in (-5, 0)",
    "kda_output_gate_rank": "KDA's output gate became full rank",
    "q_lora_rank": "MLA's queries went through a low-rank latent",
    "mla_output_gate": "MLA gained an output gate",
    "mlp_act": "SwiGLU became SiTU-GLU",
    "residual": "the standard residual became Block AttnRes",
}
switched = [field for field in DESIGN_SWITCHES if getattr(kimi_linear, field) != getattr(k3_config, field)]
numeric = (int, float)
unnamed = [f.name for f in dataclasses.fields(K3Config) if f.name not in DESIGN_SWITCHES
           and f.name != "name" and not isinstance(getattr(k3_config, f.name), (numeric, tuple))
           and getattr(kimi_linear, f.name) != getattr(k3_config, f.name)
           and not (f.name == "mla_norm_eps" and kimi_linear.mla_latent_eps == k3_config.mla_latent_eps)]
assert not unnamed, f"K3 differs from Kimi Linear in switches this sentence does not name: {unnamed}"
facts.update(design_switches=switched, parts_changed=changed)
print(f"Against Kimi Linear the hybrid recipe is the same, {len(kimi_linear.kda_layers)}:{len(kimi_linear.mla_layers)} "
      f"KDA:MLA there and {len(k3_config.kda_layers)}:{len(k3_config.mla_layers)} here. All {len(changed)} parts "
      f"above changed, most only in size (more layers, heads, experts, width); the changes in kind are {len(switched)} switches: "
      + "; ".join(DESIGN_SWITCHES[f] for f in switched) + ".")

# %% [markdown]
# ## The real thing
#
# Everything above ran a preset. The released K3 ships in its own format: a `config.json`, safetensors shards
# and an index naming every tensor, its routed experts in MXFP4 (two 4-bit values a byte, one power-of-two scale
# per 32). `python -m sim real DIR` streams such a folder layer by layer: per token it reads each layer's
# attention, router and shared experts, and in every MoE layer only the chosen experts' bytes, and records the
# same Frames you walked above (docs/released.md). The first cell below counts the real index (from the table of
# it the project ships, tiny_k3/released/k3_index_table.json) and what `--download 0-3` would fetch; the next
# writes a tiny model in exactly that layout and streams it back.
#
# With the real folder: `--tokenizer auto` uses the checkpoint's own BPE (its `tiktoken.model`) instead of
# bytes; `--download 0-3` fetches only the shards of the first four layers (the cell below prints how many
# bytes, by the same code the download uses) and streams that truncated model (`--layers 4`), whose tokens are
# not K3's (it says so); `--save RUN.npz` keeps the run, and `tiny-k3 --open RUN.npz` shows it read-only in the
# TUI: looking at frames needs no weights.

# %%
import json

from sim.real_download import parse_layers, shard_sizes, shards_for
from tiny_k3.released import RELEASED_CONFIG, expand_table, layer_of, load_k3_table

index = load_k3_table()          # the real index's names and shards, as a table (docs/released.md)
released_json = json.loads(RELEASED_CONFIG.read_text())
weight_map = {name: index["shards"][f"layer {layer_of(name)}" if layer_of(name) >= 0 else name.split(".")[0]][0]
              for name in expand_table(index)}
shard_bytes = shard_sizes(weight_map, released_json)
first_four = shards_for(weight_map, parse_layers("0-3", released_json["text_config"]["num_hidden_layers"]))
download_bytes = sum(shard_bytes[s] for s in first_four)
facts.update(release_tensors=len(weight_map), release_shards=len(set(weight_map.values())),
             release_bytes=sum(shard_bytes.values()), download_0_3_shards=len(first_four),
             download_0_3_bytes=download_bytes)
print(f"the released index: {len(weight_map):,} tensors in {len(set(weight_map.values()))} shards, "
      f"{sum(shard_bytes.values()) / 1e12:.2f} TB")
print(f"--download 0-3 fetches {len(first_four)} shards ({', '.join(s.split('-')[1] for s in first_four)} of "
      f"{len(set(weight_map.values()))}: layers 0-3 and the embedding and head): {download_bytes / 1e9:.1f} GB")

# %%
import tempfile

from sim.real import RealSimulation, layer_bytes
from sim.real_synthetic import write_synthetic_release

# a tiny K3-shaped model, its experts rounded to MXFP4, written in the released layout (`python -m sim real DIR
# --synthetic` writes the same release from a terminal)
_, _, release_dir = write_synthetic_release(tempfile.mkdtemp(prefix="tiny-k3-release-"))
real = RealSimulation(release_dir, "hi")
real.run(2)
real_frame = real.frame
real_read = real.checkpoint.bytes_read(real_frame.position)
real_experts = sum(b for t, n, b in real.checkpoint.reads if t == real_frame.position and ".experts." in n)
print(f"streamed {sorted(p.name for p in release_dir.iterdir())[:2]} ...: token {real_frame.position} went to "
      f"experts {sorted(int(e) for e in real_frame.routing[0].expert_ids)} of layer {real_frame.routing[0].layer}; "
      f"it read {real_read:,} bytes, {real_experts:,} of them experts")
k3_bytes = layer_bytes(K3Config.preset("k3"))
k3_token = k3_bytes["non_expert_per_token"] + k3_bytes["experts_per_token"]
print(f"the real K3 reads {k3_token / 1e9:.0f} GB a token this way ({k3_bytes['experts_per_token'] / 1e9:.1f} GB "
      f"of it the 16 x 92 chosen experts): {k3_token / 2e9:.0f} s at 2 GB/s")

# %% [markdown]
# ## Build it yourself: MLA's absorbed decode
#
# The token you walked read each MLA layer's cache: one latent c and one shared k_rope per past token, for all
# heads together (mla.md §2). Lesson 3's B.4 expanded those latents into per-head keys and values; a decode step
# does not have to. Because every head's key is W_kb c and its value W_vb c, the key map can move onto the one
# query and the value map after the weighted sum: the scores and the output come straight from the latent cache
# (B.5). The cell after it runs every MLA layer of the `small` model through your function on this
# lesson's prompt and compares the logits with the model's own, in float64. Three hints: `hint("B.5")`,
# `hint("B.5", 2)`, `hint("B.5", 3)`.

# %%
# (this section imports what it uses: it also runs on its own)
from checks.build import check_mla_decode, run_your_layer  # noqa: E402
from tiny_k3 import DEFAULT_PROMPT  # noqa: E402
from workshop import exercise, load_model, try_exercise, weights_note  # noqa: E402

print("the build thread, part 3: B.5 my_mla_decode -> the model's MLA layers read their latent cache with your code")

# %% [markdown]
# ### Exercise B.5 — MLA's absorbed decode (★★★, about 15 min)

# %% tags=["build"]
@exercise("mla_decode")
def my_mla_decode(q_nope, q_rope, latent, k_rope, W_kb, W_vb, scale):
    """q_nope [H, nope], q_rope [H, rope], latent [S, rank], k_rope [S, rope], W_kb [H, nope, rank],
    W_vb [H, V, rank], scale float -> o [H, V], without expanding the latents into keys and values."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_mla_decode, my_mla_decode)

# %% [markdown]
# ### The model on your decode
# `tiny_k3.swap.swapped(model, mla_decode=my_mla_decode)` makes every query of every MLA layer read the latent
# cache through your function (a prefill is run query by query, each seeing the tokens up to itself).

# %%
build_model, build_trained = load_model("small")
build_model = build_model.double().eval()          # float64: the comparison can be held to 1e-9
print(f"small, {weights_note(build_trained)}, in float64")
build_mla = run_your_layer(build_model, DEFAULT_PROMPT, mla_decode=my_mla_decode)
