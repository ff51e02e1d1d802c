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
# | gated MLA attention | a cache that grows by one latent per token | 3 |
# | latent MoE | 16 of 896 experts, their weights | 1 |
# | head | the five most likely next tokens | — |
#
# Open the TUI beside this notebook with the same preset, prompt and seed (`python tui.py --preset small
# --prompt "key=7; 3+4=" --seed 0`) and you will see the same frames.

# %%
import numpy as np
from rich.console import Console

from checks import check_num_sources, check_sublayer_order
from workshop import exercise, plt, step_slider, try_exercise
from sim import Simulation
from sim import render
from sim.memory import cache_bytes
from tiny_k3 import DEFAULT_PROMPT

sim = Simulation("small", DEFAULT_PROMPT, seed=0)    # weights="auto": trained when shipped, else random
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
grid = np.full((len(reads), max(s.depth.weights.size for s in reads)), np.nan)
for r, s in enumerate(reads):
    grid[r, : s.depth.weights.size] = s.depth.weights

fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.4, 1]})
a1.bar(range(len(stops)), [s.out_norm for s in stops], color=[colors[s.kind] for s in stops])
a1.set_xticks(range(len(stops)), [s.label for s in stops], rotation=75, fontsize=6)
a1.set_ylabel("RMS written to the stream"), a1.set_title(f"frame {i}: {frame.input_text!r} through every sublayer")
im = a2.imshow(grid, cmap="magma", vmin=0, vmax=1, aspect="auto")
a2.set_yticks(range(len(reads)), [s.label for s in reads], fontsize=6)
a2.set_xticks(range(grid.shape[1]), ["emb"] + [f"b{j}" for j in range(1, grid.shape[1])], fontsize=7)
a2.set_title("depth weights (AttnRes)"), a2.grid(False), fig.colorbar(im, ax=a2)
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 3. Step into the token
#
# `show_step(j)` draws stop j with what matters there: the KDA state and its decay, the MoE's experts,
# the depth weights of an MLA or dense stop, the head's top five. Drag the slider through all of them.

# %%
def show_step(j, frame_index=i):
    s = sim.step_into(frame_index)[j]
    fig, axes = plt.subplots(1, 2, figsize=(10, 2.8))
    title = f"stop {j}: {s.label}"
    if s.kind == "kda":
        head = 0
        axes[0].imshow(s.kda.state[head].astype(np.float32), cmap="RdBu_r", aspect="auto")
        axes[0].set_title(f"{title} — state S, head {head} (K×V)", fontsize=8), axes[0].grid(False)
        axes[1].bar(range(s.kda.decay.shape[1]), s.kda.decay[head], color="tab:green")
        axes[1].set_ylim(0, 1), axes[1].set_title(f"decay exp(g) per key channel; β = {s.kda.beta[head]:.3f}", fontsize=8)
    elif s.kind == "moe":
        r = s.routing
        img = r.scores.reshape(16, -1)
        axes[0].imshow(img, cmap="Greys", aspect="auto")
        rows, cols = np.divmod(r.expert_ids, img.shape[1])
        axes[0].scatter(cols, rows, c="crimson", s=20, marker="s")
        axes[0].set_title(f"{title} — {r.expert_ids.size} of {r.scores.size} experts", fontsize=8), axes[0].grid(False)
        axes[1].bar([str(e) for e in r.expert_ids], r.weights, color="crimson")
        axes[1].tick_params(axis="x", labelsize=6, rotation=90), axes[1].set_title("weights (sum 1)", fontsize=8)
    elif s.kind == "head":
        axes[0].barh([t for _, t, _ in s.top][::-1], [p for _, _, p in s.top][::-1], color="black")
        axes[0].set_title(f"{title} — next-token probabilities", fontsize=8)
        axes[1].bar(range(s.depth.weights.size), s.depth.weights), axes[1].set_title("final depth read", fontsize=8)
    else:
        if s.depth is not None and s.depth.weights.size:
            axes[0].bar(range(s.depth.weights.size), s.depth.weights, color=colors[s.kind])
        axes[0].set_title(f"{title} — depth weights of its input", fontsize=8)
        mem = sim.frames[frame_index].memory
        note = (f"MLA: caches {cfg.mla_cache_width} values per token;\nthis layer holds {mem.layer_bytes[s.layer]:,} B "
                f"after {frame_index + 1} tokens" if s.kind == "mla" else f"{s.kind}: RMS out {s.out_norm:.4f}")
        axes[1].text(0.05, 0.5, note, fontsize=9, va="center"), axes[1].axis("off")
    plt.tight_layout(); plt.show()


step_slider(show_step, len(stops), start=1, description="stop")

# %%
for j in (1, 4, len(stops) - 1):       # a KDA stop, an MoE stop, the head
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
# MLA cache is simply truncated — and regenerates.

# %%
sim.goto(sim.prompt_len - 1)
before = sim.text
sim.step(force_token="9")          # the model's own choice replaced by '9'
sim.run(3)
print(f"before: {before!r}\nbranch: {sim.text!r}")
print(f"bytes kept for branching (KDA snapshots): {sim.snapshot_bytes():,} B")

# %% [markdown]
# ## Exercises
#
# ### Exercise 6.1 — the route of a token
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
# ### Exercise 6.2 — how many sources does a sublayer read?
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
