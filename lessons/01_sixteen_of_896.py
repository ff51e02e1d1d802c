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
# # Lesson 1 — 16 of 896: sparse mixture of experts
#
# Every MoE layer of Kimi K3 holds **896 routed experts and 2 shared ones**; each token runs only
# **16** of the 896 (k3_facts.md §1, source S1: the released `config.json`). So the model *stores*
# 2.78 trillion parameters but one token *touches* about 104 billion: total parameters set the memory
# bill, active parameters set the compute bill.
#
# In this lesson you will
# 0. see the whole model on one diagram: where a token goes and where the memory lives;
# 1. follow the router's decision for one real token: sigmoid scores, selection bias, top-k, renormalisation,
#    and compute one MoE sublayer by hand — what one expert computes and how the 16 are mixed;
# 2. see why the selection bias exists (expert load) and watch it balance a skewed router;
# 3. count total vs active parameters from the real modules — K3 built on PyTorch's `meta` device;
# 4. see what *latent* MoE changes, and how the `mini-56/1 … mini-896/16` family trades expert size for count.
#
# Every number below is computed live from `tiny_k3` and `sim`.

# %%
import math

import numpy as np
import torch

from checks import check_active_params, check_bias_update, check_route, hint  # noqa: F401  (hint: for you)
from diagram import draw_architecture
from workshop import (bar_labels, exercise, heatmap, integer_ticks, load_model, plt, step_slider,
                      trace, try_exercise, weights_note)
from tiny_k3 import DEFAULT_PROMPT, K3Config, parameter_breakdown, parameter_counts
from tiny_k3.moe import Router, route, situ_glu
from tiny_k3.norm import rms_norm
from tiny_k3.tokenizer import token_text

facts = {}                         # what the prose below claims, measured here (tests/test_lessons.py checks it)
torch.manual_seed(0)
cfg = K3Config.preset("small")
model, trained = load_model("small")
prompt = DEFAULT_PROMPT          # the prompt the TUI and the other lessons use
ids, recs = trace(model, prompt)   # one TraceRecorder per input token, run through the real decode path
facts["trained"] = trained
print(f"preset 'small': {cfg.num_experts} experts, top-{cfg.top_k}, {cfg.num_layers} layers, MoE in layers "
      f"{cfg.moe_layers}; {weights_note(trained)}")
print(f"prompt {prompt!r} ->", " ".join(repr(token_text(i)) for i in ids))

# %% [markdown]
# ## 0. The map: one token's path, and where the memory lives
#
# The diagram is drawn from the config (`lessons/diagram.py`). Each layer is an attention sublayer (KDA or
# gated MLA, 3:1) followed by an MLP sublayer (a dense MLP in the first layer, latent MoE after). Before every
# sublayer, Attention Residuals read the depth sources (lesson 4). Under each layer: what decoding keeps
# between tokens — a fixed state for KDA (lesson 2), a cache that grows by one row per token for MLA (lesson 3).
# On the right, the inside of one MoE sublayer: this lesson.

# %%
draw_architecture(cfg)
plt.show()

# %% [markdown]
# ## 1. The router, for one token
#
# K3's router (k3_facts.md §1c, DeepSeek-V3's "noaux_tc" selection, §3b) works on the full-width hidden
# state x of the token:
#
# | step | formula | shape |
# |---|---|---|
# | affinities | s = σ(W_r x), in fp32 | [E] |
# | selection | ids = topk(s + b, k) — b is the *selection bias* | [k] |
# | weights | w = s[ids] / Σ s[ids] (× routed_scaling = 1.0 in K3) | [k] |
#
# The bias decides **which** experts win; the weights come from the **unbiased** scores. Here is the
# decision recorded for the last prompt token in the first MoE layer:

# %%
def moe_events(rec):
    """{layer: data} of the MoE events a TraceRecorder saw for one token."""
    return {layer: data for layer, data in rec.of("moe")}


layer = cfg.moe_layers[0]
ev = moe_events(recs[-1])[layer]
s, b = ev["scores"][0, 0], ev["bias"]
chosen, w = ev["expert_ids"][0, 0], ev["weights"][0, 0]
print(f"layer {layer}, token {token_text(ids[-1])!r}: scores s in [{s.min():.3f}, {s.max():.3f}], "
      f"bias b in [{b.min():+.3f}, {b.max():+.3f}]")
print(" rank  expert   score s   bias b    s + b    weight")
for r, (e, wt) in enumerate(zip(chosen.tolist(), w.tolist())):
    print(f"{r:5d}  {e:6d}   {s[e]:.4f}  {b[e]:+.4f}  {s[e] + b[e]:.4f}   {wt:.4f}")
by_score = set(s.topk(cfg.top_k).indices.tolist())
facts.update(score_min=float(s.min()), score_max=float(s.max()), bias_min=float(b.min()), bias_max=float(b.max()),
             weight_min=float(w.min()), weight_max=float(w.max()),
             chosen_because_of_bias=len(set(chosen.tolist()) - by_score))
print(f"weights sum to {w.sum():.6f}; from {w.min():.4f} to {w.max():.4f} (1/k = {1 / cfg.top_k:.4f}); "
      f"{cfg.num_experts - cfg.top_k} experts stay idle for this token")
print(f"{facts['chosen_because_of_bias']} of the {cfg.top_k} chosen experts would NOT be chosen by the score "
      "alone: the bias put them in")
chosen_s = s[chosen]
kth_best = float(s.topk(cfg.top_k).values[-1])
facts.update(chosen_score_min=float(chosen_s.min()), chosen_score_max=float(chosen_s.max()), kth_best_score=kth_best)
# w = s[ids] / Σ s[ids]: the weights' spread IS the chosen scores' spread (the sum cancels in the ratio)
assert abs(float(w.max() / w.min()) - float(chosen_s.max() / chosen_s.min())) < 1e-4, \
    "the weights are the chosen scores over their sum, so max/min of one must equal max/min of the other"
print(f"the chosen scores run from {chosen_s.min():.3f} to {chosen_s.max():.3f} (max/min {chosen_s.max() / chosen_s.min():.2f}"
      f" = the weights' max/min); the {cfg.top_k} best scores alone run from {kth_best:.3f} to {s.max():.3f}; "
      f"all {cfg.num_experts} span {s.min():.3f} to {s.max():.3f}")

# %% [markdown]
# Three things to read off the table (the test suite checks each on this very model):
#
# * **The scores.** A trained router is decisive: its scores spread over most of (0, 1). (With random
#   initial weights every logit is tiny and every score sits near σ(0) = 0.5.)
# * **The bias is as large as the scores.** Here it spans a range of the same order as the scores, so it does
#   not just break ties: it decides a good part of *which* experts win (the count above).
# * **The 16 weights are nearly flat** — within a factor of about 2 of each other and of 1/k. They are the
#   chosen scores divided by their sum, so their max/min is the chosen scores' max/min (the last line above).
#   The chosen 16 are *not* the 16 best scores: the bias swapped some in (the count above), and those score
#   below the 16th-best. What keeps the weights flat is that every chosen score, swapped in or not, is far
#   from 0 — the printed range — so no one expert's share is tiny or dominant. The routed part of the output
#   is close to a plain average of 16 experts; *which* 16 is the decision.
#
# The 896 experts drawn as 16 rows of 56 (K3's 56:1 ratio, one chosen expert per row on average):

# %%
def draw_routing(ax_grid, ax_bars, ev, title):
    s, chosen, w = ev["scores"][0, 0], ev["expert_ids"][0, 0], ev["weights"][0, 0]
    grid = s.numpy().reshape(16, -1)
    heatmap(ax_grid, grid, label="router score s = σ(W_r x)", vmin=0, vmax=1, cmap="Greys",
            xlabel="expert id mod 56", ylabel="expert id // 56")
    rows, cols = np.divmod(chosen.numpy(), grid.shape[1])
    ax_grid.scatter(cols, rows, s=40, c="crimson", marker="s")
    ax_grid.set_title(f"{title}; red: the {len(chosen)} chosen (top-k of s + b)")   # a legend would cover experts
    integer_ticks(ax_grid, "both")
    ax_bars.bar(range(len(w)), w.numpy(), color="crimson")
    ax_bars.axhline(1 / len(w), color="k", lw=1, ls="--")
    ax_bars.set_xticks(range(len(w)), [str(e) for e in chosen.tolist()], rotation=90)
    ax_bars.set_xlabel("chosen expert id"), ax_bars.set_ylabel("weight w")
    ax_bars.set_title("renormalised weights (sum 1); dashed: 1/k")


fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 4.2), gridspec_kw={"width_ratios": [2.2, 1]})
draw_routing(a1, a2, ev, f"layer {layer}: scores of all {cfg.num_experts} experts")
plt.tight_layout(); plt.show()

# %% [markdown]
# ### What the chosen experts compute, and how they are mixed
#
# One routed expert is a small gated MLP in the *latent* width ℓ: E_j(z) = W2_j SiTU-GLU(W1_j z, W3_j z),
# ℓ → m → ℓ (moe.md §3; K3: 3584 → 3072 → 3584). The MoE sublayer (moe.md §4) projects the token down once,
# z = W_down x, runs the 16 chosen experts on z, mixes them with the router's weights, normalises the sum, projects
# it back up, and adds the **shared experts**, which run on every token at full width:
#
# out = W_up RMSNorm( Σ_j w_j E_j(z) ) + Shared(x)
#
# Here it is by hand for the token above, against the model's own `LatentMoE.forward`:

# %%
moe_layer = model.blocks[layer].mlp
depth_reads = [(lay, d) for lay, d in recs[-1].of("depth") if lay == layer and d["site"] == "mlp"]
h_in = depth_reads[0][1]["h"]                                # the AttnRes read before this MoE sublayer
with torch.no_grad():
    x = model.blocks[layer].mlp_norm(h_in)[0, 0]             # its PreNorm: what the MoE sees   [D]
    z = moe_layer.down(x)                                    # down to the latent               [l]
    expert_out = torch.stack([moe_layer.w2[e] @ situ_glu(moe_layer.w1[e] @ z, moe_layer.w3[e] @ z,
                                                          cfg.situ_beta_gate, cfg.situ_beta_up)
                              for e in chosen.tolist()])    # one row per chosen expert        [k, l]
    mixed = (w[:, None].to(z.dtype) * expert_out).sum(0)     # the weighted sum                 [l]
    routed = moe_layer.up(moe_layer.latent_norm(mixed))      # norm after the full sum, back up [D]
    shared = moe_layer.shared(x)                             # the shared experts               [D]
    by_hand = routed + shared
    real = moe_layer(x[None, None])[0, 0]
facts["moe_by_hand_max_diff"] = float((by_hand - real).abs().max())
rms = lambda v: float(v.pow(2).mean().sqrt())  # noqa: E731
print(f"x [{cfg.hidden_size}] -> z [{cfg.latent_dim}] -> {cfg.top_k} experts, each [{cfg.latent_dim}] -> "
      f"weighted sum -> RMSNorm -> up [{cfg.hidden_size}] + shared")
print(f"by hand vs LatentMoE.forward: max |diff| = {facts['moe_by_hand_max_diff']:.1e}")
print(f"RMS of the routed part {rms(routed):.3f}, of the shared experts {rms(shared):.3f}; the 16 expert "
      f"outputs have RMS {', '.join(f'{rms(o):.3f}' for o in expert_out[:4])}, …")

# %% [markdown]
# ### Step through the prompt
# `show_step(i)` shows the routing of input token i (slider in the notebook). Notice that *which*
# experts fire changes from token to token — that is what spreads the load over all 896.

# %%
def show_step(i, layer=cfg.moe_layers[-1]):
    ev = moe_events(recs[i])[layer]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 4.0), gridspec_kw={"width_ratios": [2.2, 1]})
    draw_routing(a1, a2, ev, f"token {i} {token_text(ids[i])!r}, layer {layer}")
    plt.tight_layout(); plt.show()


step_slider(show_step, len(ids), start=len(ids) - 1, description="token")

# %%
show_step(1)

# %% [markdown]
# ## 2. The selection bias: who, not how much
#
# Nudge one idle expert's bias up until it enters the top-16. It is now *chosen*, but its *weight*
# is still computed from its unbiased score — the bias never leaks into the output.

# %%
idle = int(torch.argsort(s + b)[-cfg.top_k - 5])      # an expert a few places below the cut
cut = (s + b).topk(cfg.top_k).values[-1]               # the k-th largest biased score
bias2 = b.clone()
bias2[idle] += cut - (s[idle] + b[idle]) + 1e-3        # just enough to pass the cut
print(f"raise expert {idle}'s bias by {bias2[idle] - b[idle]:.4f}")
before, after = route(s, b, cfg.top_k), route(s, bias2, cfg.top_k)
print(f"expert {idle}: chosen before? {idle in before.expert_ids.tolist()}  after? {idle in after.expert_ids.tolist()}")
pos = after.expert_ids.tolist().index(idle)
print(f"its weight = s / Σ s[ids] = {s[idle]:.5f} / {s[after.expert_ids].sum():.4f} = {after.weights[pos]:.5f} "
      "(no bias in it)")

# %% [markdown]
# ### Why a bias at all? Expert load
#
# If some experts win for most tokens, they become the bottleneck (and in expert parallelism, their
# GPU does). DeepSeek-V3's *aux-loss-free* balancing (k3_facts.md §3b) nudges b after every batch:
# overloaded experts get b − γ, underloaded ones b + γ. K3 trains its bias with "Quantile Balancing"
# instead (§3c) and freezes it at inference; the effect is the same: flat load.
#
# Below, a router with the small preset's shapes sees 512 tokens that share a common direction
# (as real hidden states do), so the load piles up: a few dozen of the 896 experts take half of the routed slots
# and hundreds take none (the cell prints how many). Then we run the real `Router.update_bias` (γ = 0.001,
# DeepSeek-V3's value) for 120 batches.

# %%
torch.manual_seed(0)
router = Router(cfg.hidden_size, cfg.num_experts, cfg.top_k)
x = torch.randn(512, cfg.hidden_size) + torch.randn(cfg.hidden_size)   # skewed inputs
history = []
with torch.no_grad():
    scores = router(x).scores          # s does not depend on the bias: compute it once
    for step in range(120):
        chosen_ids = route(scores, router.bias, cfg.top_k).expert_ids
        load = torch.bincount(chosen_ids.flatten(), minlength=cfg.num_experts).float()
        if step == 0:
            load_before = load.clone()
        history.append((load.max() / load.mean()).item())
        router.update_bias(load, rate=1e-3)
load_after = load


def half_of_slots(load):
    """The fewest experts that take half of the routed slots."""
    busiest = load.sort(descending=True).values
    return int((busiest.cumsum(0) < busiest.sum() / 2).sum()) + 1


facts.update(balance_before=history[0], balance_after=history[-1], half_slots_before=half_of_slots(load_before),
             idle_before=int((load_before == 0).sum()))
print(f"before balancing, half of the {int(load_before.sum()):,} routed slots go to the {half_of_slots(load_before)} "
      f"busiest of {cfg.num_experts} experts ({half_of_slots(load_after)} after)")
print(f"max/mean load: {history[0]:.1f} before, {history[-1]:.2f} after 120 updates; "
      f"idle experts: {(load_before == 0).sum()} -> {(load_after == 0).sum()}")

fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.8))
a1.plot(load_before.sort(descending=True).values, label="before")
a1.plot(load_after.sort(descending=True).values, label="after balancing")
a1.axhline(load.mean(), color="k", ls="--", lw=1, label="mean = k·T/E")
a1.set_xlabel("experts, busiest first"), a1.set_ylabel("tokens routed (symlog)"), a1.legend()
a1.set_yscale("symlog", linthresh=1), a1.set_ylim(bottom=0), integer_ticks(a1, "x")
a2.plot(history), a2.set_xlabel("bias update (batch)"), a2.set_ylabel("max / mean load (log)"), a2.set_yscale("log")
a2.set_title("aux-loss-free balancing (Router.update_bias)"), integer_ticks(a2, "x")
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 3. Total vs active parameters, counted from real modules
#
# `tiny_k3.parameter_counts` builds the model on PyTorch's `meta` device — real `nn.Module`s with
# shapes but no memory — and adds up `p.numel()`. For the `k3` preset that is the released config
# (k3_facts.md §1b): **no hand formula**. "Active" follows the convention of K3's 104B figure (§1d):
# everything a token multiplies, i.e. all but the input embedding (a lookup) and the 880 idle experts.

# %%
k3 = K3Config.preset("k3")
total, active = parameter_counts(k3)
parts = parameter_breakdown(k3)
print(f"K3: total {total / 1e12:.4f}T, active {active / 1e9:.2f}B  "
      f"(model card: 2.8T / 104B, S2/S3; tech report 104.2B) -> {total / active:.1f}x")
routed_active = parts["routed_experts"] * k3.top_k // k3.num_experts
for name, n in sorted(parts.items(), key=lambda kv: -kv[1]):
    act = routed_active if name == "routed_experts" else (0 if name == "embedding" else n)
    print(f"  {name:15s} {n / 1e9:9.2f}B stored   {act / 1e9:7.2f}B active")

facts.update(k3_total=total, k3_active=active)
names = sorted(parts, key=lambda n: -parts[n])
fig, ax = plt.subplots(figsize=(12, 4.2))
xs = np.arange(len(names))
stored = ax.bar(xs - 0.2, [parts[n] / 1e9 for n in names], 0.4, label="stored (total)")
ax.bar(xs + 0.2, [(routed_active if n == "routed_experts" else 0 if n == "embedding" else parts[n]) / 1e9
                  for n in names], 0.4, label="active per token")
bar_labels(ax, stored, lambda v: f"{v:.4g}B")
ax.set_yscale("log"), ax.set_ylabel("parameters (billions, log)"), ax.set_xticks(xs, names, rotation=25, ha="right")
ax.set_title(f"K3 on the meta device: {total / 1e12:.2f}T stored, {active / 1e9:.0f}B active"), ax.legend()
plt.tight_layout(); plt.show()

# %%
always_on = active - routed_active
print(f"routed experts: {parts['routed_experts'] / total:.1%} of K3's parameters, but only {k3.top_k}/{k3.num_experts} "
      f"= {k3.top_k / k3.num_experts:.1%} of them run per token")
print(f"always-on part (attention, shared experts, router, projections, head): {always_on / 1e9:.1f}B "
      f"= {always_on / active:.0%} of the active {active / 1e9:.1f}B")

# %% [markdown]
# ## 4. Latent MoE
#
# K3's "Stable LatentMoE" (k3_facts.md §2, NVIDIA's LatentMoE, S26) routes on the full width
# d = 7168 but projects the token **down to ℓ = 3584 before dispatch**; experts run in ℓ and the sum is
# RMS-normed and projected back up. Each expert is smaller, so K3 affords more of them and a larger top-k
# — and the bytes sent to the experts per token stay K2's (lesson 5).

# %%
from sim.costs import K2  # noqa: E402  (K2's config, k3_facts.md §3a)

k3_expert = 3 * k3.latent_dim * k3.moe_intermediate
k2_expert = 3 * K2["d"] * K2["moe_inter"]
print(f"{'':22s} {'K2':>10s} {'K3':>10s}")
print(f"{'width experts see':22s} {K2['d']:>10,} {k3.latent_dim:>10,}   (K3: d/ℓ = {k3.hidden_size // k3.latent_dim})")
print(f"{'experts / top-k':22s} {str(K2['experts']) + ' / ' + str(K2['top_k']):>10s} "
      f"{str(k3.num_experts) + ' / ' + str(k3.top_k):>10s}")
print(f"{'params per expert':22s} {k2_expert / 1e6:>9.1f}M {k3_expert / 1e6:>9.1f}M   ({k3_expert / k2_expert:.2f}x)")
print(f"{'values sent per token':22s} {K2['top_k'] * K2['d']:>10,} {k3.top_k * k3.latent_dim:>10,}   (same)")

# %% [markdown]
# ## 5. Granularity: the mini family
#
# `mini-56/1 … mini-896/16` (k3_facts.md §7) keep the **same routed parameters and the same active
# routed parameters**: N experts of width m = 256/k, top-k, always 56:1. Finer experts give the router
# vastly more combinations to choose from at the same *expert* compute. The router itself (N × d per layer,
# always active) grows with N, and at this toy width that is not small: the table's active column rises with it
# (the line under the table says by how much, and how little it is at K3's width).

# %%
rows = []
for n, k in [(56, 1), (112, 2), (224, 4), (448, 8), (896, 16)]:
    c = K3Config.preset(f"mini-{n}/{k}")
    t, a = parameter_counts(c)
    p = parameter_breakdown(c)
    per_expert = p["routed_experts"] // (len(c.moe_layers) * n)
    combos = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    rows.append((c.name, t, a, p["routed_experts"], per_expert, p["router"], combos / math.log(10)))
print(f"{'preset':12s} {'total':>10s} {'active':>9s} {'routed':>10s} {'per expert':>10s} {'router':>8s} "
      f"{'log10 C(N,k)':>12s}")
for r in rows:
    print(f"{r[0]:12s} {r[1]:>10,} {r[2]:>9,} {r[3]:>10,} {r[4]:>10,} {r[5]:>8,} {r[6]:>12.1f}")
without_router = {r[2] - r[5] for r in rows}
assert len(without_router) == 1, "the mini family keeps the active parameters outside the router equal"
k3_parts = parameter_breakdown(k3)
print(f"active without the router: {without_router.pop():,} for all five; the router adds {rows[0][5]:,} -> "
      f"{rows[-1][5]:,}, so active goes {rows[0][2] / 1e6:.2f}M -> {rows[-1][2] / 1e6:.2f}M "
      f"(+{rows[-1][2] / rows[0][2] - 1:.0%}). In K3 the router is {k3_parts['router'] / 1e9:.2f}B of "
      f"{facts['k3_active'] / 1e9:.1f}B active ({k3_parts['router'] / facts['k3_active']:.1%}): there the extra choice is nearly free.")

fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.8))
labels = [r[0][5:] for r in rows]
a1.bar(labels, [r[6] for r in rows], color="tab:purple"), a1.set_ylabel("log10 (expert combinations)")
a1.set_title("choices per token: C(N, k)"), a1.set_xlabel("experts N / top-k")
a2.plot(labels, [r[2] / 1e6 for r in rows], "o-", label="active")
a2.plot(labels, [(r[2] - r[5]) / 1e6 for r in rows], "s--", label="active without the router")
a2.set_ylabel("parameters (M)"), a2.set_title("active parameters per token"), a2.legend()
a2.set_xlabel("experts N / top-k")
plt.tight_layout(); plt.show()

# %% [markdown]
# ## Exercises
#
# Write the function, then run the cell: the check tests it on random inputs against the project's own
# implementation and tells you what is off. Stuck? `hint("1.1")` names the idea, `hint("1.1", 2)` the
# shape of the computation, `hint("1.1", 3)` the code. (Instructors: `TINY_K3_SOLUTIONS=1` runs the reference
# solutions from `lessons/solutions/`.)
#
# ### Exercise 1.1 — route a batch of tokens (★☆☆, about 10 min)
# Top-k of s + b for the selection, the unbiased s for the weights, renormalised to sum to 1.

# %% tags=["exercise"]
@exercise("route")
def my_route(scores, bias, top_k):
    """scores [T, E] sigmoid affinities, bias [E] -> (expert_ids [T, k] long, weights [T, k])."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_route, my_route)

# %% [markdown]
# ### Exercise 1.2 — active parameters from the breakdown (★☆☆, about 8 min)
# Given `parameter_breakdown(config)` (parameters per part), return what one token touches.

# %% tags=["exercise"]
@exercise("active_params")
def my_active_params(parts, num_experts, top_k):
    """parts: dict of parameters per part -> active parameters per token (int)."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_active_params, my_active_params)

# %% [markdown]
# ### Exercise 1.3 — one step of aux-loss-free balancing (★☆☆, about 6 min)
# Overloaded experts (load above the mean) go down by `rate`, underloaded ones up, balanced ones stay.

# %% tags=["exercise"]
@exercise("bias_update")
def my_bias_update(bias, load, rate):
    """bias [E], load [E] tokens per expert, rate: float -> the new bias [E]."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_bias_update, my_bias_update)

# %% [markdown]
# **Take-away.** Sparse MoE decouples what a model *knows* (2.78T stored) from what a token *costs*
# (104B active). The router's bias keeps the 896 experts equally busy without touching the mixing
# weights, and latent MoE spends the width it saves on more, finer experts.
