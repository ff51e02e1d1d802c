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
# # Lesson 4 — Attention Residuals: attention over depth
#
# A standard PreNorm network adds every sublayer's output to one running sum: h_l = v_0 + v_1 + … +
# v_{l−1}, each with weight 1. Attention Residuals (Kimi Team, arXiv:2603.15031; attnres.md) replace that
# fixed sum with **softmax attention over depth**: every sublayer l has a learned pseudo-query w_l and
# reads
#
# α_{i→l} = softmax_i( w_l · RMSNorm(v_i) ),   h_l = Σ_i α_{i→l} v_i      (attnres.md §2, Eqs. 1–4)
#
# — keys are the RMS-normalised sources, values the **raw** sources, no 1/√d, one weight per source.
# K3 uses the *Block* variant (k3_facts.md §1c): sources are the embedding, the sums of completed blocks,
# and the current block's partial sum.
#
# In this lesson: one depth read by hand; why zero-initialised queries make AttnRes *the same network*
# as a standard residual (up to RMSNorm's eps); why what AttnRes reads cannot pile up, on the trained model;
# Block AttnRes's sources and weights on a real model; and why this is a training-time win, not a
# serving one.

# %%
import numpy as np
import torch

from checks import check_block_sources, check_depth_attention, hint  # noqa: F401  (hint: for you)
from figures import depth_grid
from workshop import (exercise, heatmap, integer_ticks, load_model, plt, step_slider, try_exercise,
                      weights_note)
from tiny_k3 import DEFAULT_PROMPT, K3Config, TinyK3, TraceRecorder
from tiny_k3.attnres import depth_attention
from tiny_k3.tokenizer import encode, token_text

facts = {}                         # what the prose below claims, measured here (tests/test_lessons.py checks it)
torch.manual_seed(0)
f64 = dict(dtype=torch.float64)
prompt = DEFAULT_PROMPT

# %% [markdown]
# ## 1. One depth read
#
# Three sources for one token (D = 8): the embedding and two sublayer outputs of very different sizes.
# Because the keys are RMS-normalised, a loud source does not win by being loud; but the value it
# contributes is its raw self.

# %%
D = 8
sources = torch.stack([torch.randn(D, **f64) * s for s in (0.1, 1.0, 10.0)])   # [N, D]
query = torch.randn(D, **f64)
for name, w in [("zero query (init)", torch.zeros(D, **f64)), ("a learned query", query)]:
    h, weights = depth_attention(sources[:, None, None], w)                 # [N, B=1, T=1, D]
    print(f"{name:18s} weights {np.round(weights[0, 0].numpy(), 3)}  ‖h‖ = {h.norm():.3f}")
print(f"mean of the sources: ‖mean‖ = {sources.mean(0).norm():.3f}   (zero query: h is the MEAN)")

# %% [markdown]
# ## 2. Zero-initialised queries reproduce the standard residual under PreNorm
#
# With w_l = 0 every weight is 1/l, so h_l is the **mean** of the sources — the standard residual sum
# divided by l. Every consumer of h_l is an RMSNorm (the next sublayer's PreNorm, or the final norm),
# and RMSNorm does not care about scale. So at initialisation an AttnRes network computes **the same
# function** as the standard network with the same weights (attnres.md §3). We check it on the small
# preset: one set of weights, three residual modes.

# %%
def same_weights_models(cfg, dtype=torch.float64):
    """{mode: model} sharing every weight; AttnRes's pseudo-queries are zero as initialised."""
    torch.manual_seed(0)
    base = TinyK3(cfg.replace(residual="block"), dtype=dtype)
    models = {"block": base}
    for mode in ("full", "standard"):
        m = TinyK3(cfg.replace(residual=mode), dtype=dtype)
        m.load_state_dict({k: v for k, v in base.state_dict().items() if k in m.state_dict()}, strict=False)
        models[mode] = m
    return models


tokens = torch.tensor([encode(prompt)])
for eps in (1e-12, 1e-5):
    models = same_weights_models(K3Config.preset("small", rms_norm_eps=eps))
    with torch.no_grad():
        logits = {mode: m(tokens)[0] for mode, m in models.items()}
    diff = {mode: (logits[mode] - logits["standard"]).abs().max().item() for mode in ("block", "full")}
    diff["block-full"] = (logits["block"] - logits["full"]).abs().max().item()
    size = logits["standard"].abs().max().item()
    rec = TraceRecorder()
    with torch.no_grad():
        models["full"](tokens, recorder=rec)
    mean_square = [d["h"].pow(2).mean(-1).min().item() for _, d in rec.of("depth")]   # what the next RMSNorm sees
    facts[f"eps{eps:g}"] = dict(block=diff["block"], full=diff["full"], block_full=diff["block-full"], logits=size,
                                mean_square_min=min(mean_square))
    print(f"RMSNorm eps = {eps:g}: max |logits − standard| Block {diff['block']:.2g} ({diff['block'] / size:.1%}), "
          f"Full {diff['full']:.2g} ({diff['full'] / size:.1%}), |Block − Full| {diff['block-full']:.2g} — on logits "
          f"of at most {size:.2f}; the smallest mean(h²) a norm sees in Full is {min(mean_square):.2g} "
          f"= {min(mean_square) / eps:,.0f} eps")
tiny, preset = facts["eps1e-12"], facts["eps1e-05"]
assert max(tiny["block"], tiny["full"]) < 1e-6 * tiny["logits"] < 0.01 * preset["logits"] < preset["full"], \
    "zero queries give the standard residual's logits when eps is negligible, and not at the preset's eps"
assert preset["mean_square_min"] < 1000 * 1e-5, "the text says the smallest mean(h²) is within a thousand eps"

# %% [markdown]
# With a negligible eps (1e-12) the three agree to float64 rounding. With the preset's eps = 1e-5 they do
# **not** agree, and not by rounding: the percentages printed above, millions of times float64's rounding.
# The cause is RMSNorm's eps. Zero queries make h_l the *mean* of the sources, the standard stream divided by l,
# and RMSNorm(x / l) = RMSNorm(x) only if eps is negligible next to mean(x²) / l². At initialisation the hidden
# states are small (weights of std 0.02): the last number printed is the smallest mean(h²) a norm sees, in
# units of eps, and at only tens to hundreds of eps, dividing by l moves that norm's output by a visible
# fraction. So zero-initialised AttnRes is the standard residual *up to eps* (attnres.md §3): exactly in the
# limit, and at this preset's eps and size a gap of the percentages above.
#
# ## 3. What AttnRes reads cannot pile up
#
# In a standard network the stream keeps adding outputs, x_l = b_0 + Σ_{i<l} v_i, so its size grows with depth
# (attnres.md §5, Fig. 5: deeper layers must "shout" to be heard). AttnRes's h_l is a convex combination of its
# sources, so ‖h_l‖ ≤ max_i ‖source_i‖ — it cannot accumulate past its largest source. At initialisation that
# is no test at all (h_l is then x_l / l, a rescaling, and §2 showed a rescaling is the same function), so here
# is the trained small model, whose depth weights are far from uniform. For the last prompt token, before each
# sublayer: what it read (h_j), the largest of its Block AttnRes sources, and the plain sum of the same outputs
# that a standard residual would have carried.

# %%
model, trained = load_model("small")
cfg = model.config
ids = encode(prompt)
rec = TraceRecorder()
with torch.no_grad():
    model(torch.tensor([ids]), recorder=rec)
depth_events = [d for _, d in rec.of("depth")]                       # reads j = 0 .. 2L, in order
outputs = [d["out"][0, -1].double() for _, d in rec.of("sublayer")]  # v_1 .. v_2L of the last token   [D]
embedding = depth_events[0]["h"][0, -1].double()                     # the first read has one source: b_0
S = cfg.attnres_block_size
read_norm, bound, plain_sum, rebuilt_err = [], [], [], 0.0
for j, d in enumerate(depth_events):
    done = outputs[:j]
    blocks = [torch.stack(done[b:b + S]).sum(0) for b in range(0, j - j % S, S)]   # completed block sums
    sources = [embedding] + blocks + ([torch.stack(done[j - j % S:]).sum(0)] if j % S else [])
    h, alpha = d["h"][0, -1].double(), d["weights"][0, -1].double()
    rebuilt_err = max(rebuilt_err, float((sum(a * v for a, v in zip(alpha, sources)) - h).abs().max()))
    read_norm.append(float(h.norm())), bound.append(max(float(v.norm()) for v in sources))
    plain_sum.append(float((embedding + sum(done, torch.zeros_like(embedding))).norm()))
assert rebuilt_err < 1e-4, f"the sources rebuilt here must mix back into the model's h_j (max error {rebuilt_err:.1e})"
assert all(r <= b * (1 + 1e-5) for r, b in zip(read_norm, bound)), "a convex combination never exceeds its largest source"
facts.update(read_norm_max=max(read_norm), plain_sum_first=plain_sum[0], plain_sum_last=plain_sum[-1],
             below_bound=True, sources_rebuilt_err=rebuilt_err)

fig, ax = plt.subplots(figsize=(11, 4))
ax.plot(plain_sum, "-", color="tab:grey", lw=2, label="plain sum b_0 + Σ v_i (a standard residual's stream)")
ax.plot(bound, "--", color="tab:orange", lw=2, label="largest source ‖source_i‖ (the bound)")
ax.plot(read_norm, "o-", color="tab:blue", label="what AttnRes read, ‖h_j‖")
for b in range(S, len(depth_events), S):
    ax.axvline(b - 0.5, color="k", lw=0.5, ls=":")
ax.set_xlabel(f"read j, before sublayer j (dotted: a block of S = {S} closes)"), ax.set_ylabel("L2 norm")
ax.set_title(f"trained {cfg.name}, token {token_text(ids[-1])!r}: the read stays under its largest source")
ax.legend(loc="upper left"), integer_ticks(ax, "x")
plt.tight_layout(); plt.show()
print(f"plain sum of the outputs: {plain_sum[0]:.2f} -> {plain_sum[-1]:.2f}; AttnRes reads at most "
      f"{max(read_norm):.2f}, always under the largest source (rebuilt sources match h to {rebuilt_err:.0e})")

# %% [markdown]
# The bound is what the convex combination guarantees, whatever training did; the grey line is what the same
# outputs would add up to without it. This shows the size of what each sublayer reads, not that the model is
# better for it: the benefit is measured in training loss (section 5), not in one forward pass.
#
# ## 4. Block AttnRes on the real model
#
# K3's released config sets `attn_res_block_size = 12` (k3_facts.md §1b), and K3's code closes a
# block every 12 *transformer layers* (§1c), which is 24 sublayers: tiny_k3 counts sublayers per block
# (the paper's unit), so its `k3` preset says 24, and the small preset uses 4. Before sublayer j (layer i's attention is j = 2i,
# its MLP 2i + 1) the sources are: the embedding b_0, one sum per completed block, and the partial sum
# of the current block if it has started. Here are the depth weights recorded for one token of the small
# model — each row is one sublayer's read, each column one source.

# %%
def depth_rows(model, ids):
    """Per input token: list of (layer, site, weights [N]) for every depth read, decoding token by token."""
    cache, out = None, []
    with torch.no_grad():
        for tok in ids:
            rec = TraceRecorder()
            _, cache = model(torch.tensor([[tok]]), cache, recorder=rec)
            out.append([(layer, d["site"], d["weights"][0, 0].numpy()) for layer, d in rec.of("depth")])
    return out


reads = depth_rows(model, ids)
# the same model with the pseudo-queries moved off zero, as training would move them
moved = TinyK3(cfg)
moved.load_state_dict(model.state_dict())
with torch.no_grad():
    for name, p in moved.named_parameters():
        if name.endswith("res.query"):
            p.normal_(0, 3.0)
reads_moved = depth_rows(moved, ids)
zero = all(float(p.detach().abs().max()) == 0 for n, p in model.named_parameters() if n.endswith("res.query"))
print("this model's pseudo-queries are all zero, as initialised" if zero else "this model's pseudo-queries were trained")
grid_last, columns = depth_grid(reads[-1], cfg.attnres_block_size, cfg.num_layers)
facts["depth_sources_max"] = int(max(len(w) for _, _, w in reads[-1]))
facts["depth_rows_sum_to_one"] = bool(np.allclose(np.nansum(grid_last, 1), 1, atol=1e-5))
print(f"{weights_note(trained)}; {len(reads[-1])} depth reads per token "
      f"(2 per layer × {cfg.num_layers} + 1 before the head), at most {facts['depth_sources_max']} sources; by column: "
      f"{', '.join(columns)}")


def show_step(i):
    fig, axes = plt.subplots(1, 2, figsize=(14, 6.2))
    panels = [(axes[0], reads[i], "this model's queries"), (axes[1], reads_moved[i], "queries set at random (std 3)")]
    for ax, rows, title in panels:
        grid, labels = depth_grid(rows, cfg.attnres_block_size, cfg.num_layers)
        heatmap(ax, grid, label="depth weight α (each row sums to 1)", vmin=0, vmax=1, cmap="viridis",
                xlabel="source", ylabel="the read before …")
        ax.set_yticks(range(len(rows)), [f"L{layer} {site}" if site != "out" else "head" for layer, site, _ in rows])
        ax.set_xticks(range(len(labels)), labels)
        ax.set_title(f"token {i} {token_text(ids[i])!r}: {title}")
    plt.tight_layout(); plt.show()


step_slider(show_step, len(ids), start=len(ids) - 1, description="token")

# %%
show_step(3)

# %% [markdown]
# Columns are the sources: `emb` (the embedding b_0), `b1`, `b2`, … (the sums of completed blocks of
# S sublayers) and `partial` (the current block's partial sum, once it has started). With zero queries each
# row is exactly uniform (1/N over its N sources) — that uniformity is the standard residual, up to eps. Once the
# queries move, the weights depend on the token: compare two tokens with the slider. The last row ("head") is
# the final aggregation before the head.
#
# ## 5. A training-time win, not a serving one
#
# What AttnRes buys is **better models for the same training compute**: the paper's scaling laws give
# Block AttnRes the loss of a baseline trained with 1.25× the compute; Kimi Linear 48B gains e.g.
# +7.5 on GPQA-Diamond (attnres.md §5, Tables 2–3; K3: "25% higher training efficiency at <2% extra
# cost", k3_facts.md §1, S14). What it costs at serving time is small, and it saves nothing there:

# %%
from sim.costs import serving_model  # noqa: E402

k3 = K3Config.preset("k3")
d, b = k3.hidden_size, k3.dtype_bytes
S = k3.attnres_block_size
L = k3.num_sublayers
N = 1 + L // S + (L % S > 0)                       # sources before the head: embedding + completed blocks + partial
standard_io = 3 * d * b * L                        # read x, read f(x), write x + f(x) per sublayer (Table 1)
block_io = (N / S + 5) * d * b * L                 # Block AttnRes, two-phase schedule (Table 1, symbolic)
sm = serving_model(k3)                             # K3's release: MXFP4 experts, BF16 rest
weights_read = sm.dense_bytes + sm.moe_layers * sm.top_k * sm.expert_bytes   # active weights one token reads
stored = 1 + L // S                                # kept for the whole pass: the embedding + completed block sums
print(f"K3 decode, per token: residual-stream I/O standard {standard_io / 1e6:.1f} MB, Block AttnRes "
      f"{block_io / 1e6:.1f} MB (N = {N} sources before the head: the embedding, {L // S} completed block sums and "
      f"{N - stored} partial sum; S = {S} sublayers a block)")
print(f"  vs active weights read per step ≈ {weights_read / 1e9:.0f} GB: the extra is "
      f"{(block_io - standard_io) / weights_read:.1e} of it — no serving win, and almost no serving cost")
prefill_tokens = 128 * 1024
print(f"prefill: the block representations kept for the whole pass, the embedding and the {L // S} completed block "
      f"sums (N − {N - stored} = {stored}: the partial sum is the running stream a standard residual keeps too), take "
      f"{stored} × T × d × b = {stored} × {prefill_tokens:,} × {d} × {b} B = {stored * prefill_tokens * d * b / 1e9:.1f} GB "
      f"at 128K tokens (attnres.md §4: 15 GB for 8 blocks) — why they are sharded over the sequence.")
facts.update(attnres_sources=N, attnres_stored=stored, attnres_prefill_bytes=stored * prefill_tokens * d * b)

# %% [markdown]
# AttnRes changes nothing about what decode must keep per token (no new cache — the sources are recomputed
# each forward pass) and little about what it reads; it does not shrink the KV cache or the weights.
# Its payoff is the loss curve — a better model at the same size, which is a *training* efficiency.
#
# ## Exercises
#
# ### Exercise 4.1 — one depth-attention read (★★☆, about 12 min)
# For one token: RMS-normalise the keys (with the gain), dot them with the query, softmax over the
# sources, mix the **raw** sources. (`hint("4.1")`, then `hint("4.1", 2)` and `hint("4.1", 3)` if you are stuck.)

# %% tags=["exercise"]
@exercise("depth_attention")
def my_depth_attention(sources, query, norm_weight):
    """sources [N, D], query [D], norm_weight [D] -> (h [D], weights [N]); eps = 1e-6."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_depth_attention, my_depth_attention)

# %% [markdown]
# ### Exercise 4.2 — the sources of Block AttnRes (★★★, about 12 min)
# Given the embedding and the outputs so far, list what the next sublayer attends over.

# %% tags=["exercise"]
@exercise("block_sources")
def my_block_sources(embedding, outputs, block_size):
    """embedding [D], outputs: list of [D], block_size S -> list of [D] sources, embedding first."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_block_sources, my_block_sources)

# %% [markdown]
# **Take-away.** AttnRes lets each sublayer choose how much of each earlier block it reads. Initialised
# at zero it is the standard residual up to RMSNorm's eps (section 2 printed the gap at this preset's eps), so
# training starts from familiar ground; what it reads stays under its largest source, and it pays off in
# training efficiency, while costing serving almost nothing.
