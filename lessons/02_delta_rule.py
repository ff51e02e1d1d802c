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
# # Lesson 2 — The delta rule: from linear attention to Kimi Delta Attention
#
# Softmax attention remembers by keeping every past key and value (a cache that grows, lesson 3).
# Linear attention instead folds the past into a **fixed-size matrix** S ∈ R^{K×V} — a key→value
# memory that each token writes to and reads from. Kimi Delta Attention (KDA), used in 69 of K3's 93
# layers, is the latest step of a short family tree (kda.md §1):
#
# | memory | write (per token) | what it adds |
# |---|---|---|
# | linear attention | S_t = S_{t−1} + k_t v_tᵀ | piles values up |
# | delta rule (DeltaNet) | S_t = S_{t−1} + β_t k_t (v_t − S_{t−1}ᵀ k_t)ᵀ | writes only the *error* |
# | gated DeltaNet (GDN) | as above, after S ← α_t S (one scalar α_t per head) | forgets |
# | **KDA** | S' = Diag(exp g_t) S_{t−1};  S_t = S' + β_t k_t (v_t − S'ᵀ k_t)ᵀ | forgets **per key channel** |
#
# and every variant reads o_t = S_tᵀ (scale · q_t).
#
# What is the memory for? The shipped models learned, among other things, the recall lines of their training
# corpus (`tiny_k3.corpus`): `a=3; q=8; <filler> | q=8; a=3;` — key-value pairs, some filler, then after the
# mark `|` the keys again, whose values must come back. In a KDA layer nothing but the K × V state carries
# `q=8` from the definition to the query. This lesson's prompt is such a line.
#
# In this lesson: the delta rule's correction made visible on a synthetic key-value stream; what per-channel
# decay buys; the recurrent form equals the chunked form numerically; the short convolution in front of the
# memory and the tail it caches; the state of a real KDA layer changing token by token; and, on the trained
# model, which head writes the value at its definition and reads it back at the query — measured, head by head.

# %%
import math

import numpy as np
import torch
import torch.nn.functional as F

from checks import check_kda_gate, check_kda_step, check_read_weights, hint  # noqa: F401  (hint: for you)
from figures import percent_ci
from workshop import (exercise, expected_answer, heatmap, integer_ticks, load_model, plt, step_slider, trace,
                      try_exercise, weights_note)
from tiny_k3 import DEFAULT_PROMPT, K3Config
from tiny_k3.kda import kda_chunked, kda_recurrent
from tiny_k3.tokenizer import token_text

facts = {}                         # what the prose below claims, measured here (tests/test_lessons.py checks it)
torch.manual_seed(0)
f64 = dict(dtype=torch.float64)

# %% [markdown]
# ## 1. Linear attention piles up; the delta rule corrects
#
# Store a value under a key, then store a *new* value under the same key. With orthonormal keys:
#
# * linear attention returns v₁ + v₂ — the old value is still in there;
# * the delta rule (β = 1) first asks the memory what it already returns for k (S'ᵀk = v₁), writes only
#   the difference v₂ − v₁, and returns exactly v₂.
#
# For the delta rule we use the project's own `kda_recurrent` with g = 0 (no decay): KDA with no
# forgetting *is* DeltaNet.

# %%
K = V = 4
keys = torch.linalg.qr(torch.randn(K, K, **f64))[0].T          # orthonormal rows
v1, v2 = torch.tensor([1.0, 0, 0, 0], **f64), torch.tensor([0, 2.0, 0, 0], **f64)


def linear_attention(ks, vs):
    """S = Σ k vᵀ: the linear-attention memory after writing every (k, v)."""
    return sum(torch.outer(k, v) for k, v in zip(ks, vs))


def delta_memory(ks, vs, beta=1.0, g=None):
    """The KDA / delta-rule memory after writing every (k, v), via tiny_k3.kda.kda_recurrent."""
    T = len(ks)
    k = torch.stack(ks).view(1, T, 1, -1)
    v = torch.stack(vs).view(1, T, 1, -1)
    g = torch.zeros_like(k) if g is None else g.view(1, T, 1, -1)
    _, S = kda_recurrent(k, k, v, g, torch.full((1, T, 1), beta, **f64), output_final_state=True)
    return S[0, 0]


for name, S in [("linear attention", linear_attention([keys[0], keys[0]], [v1, v2])),
                ("delta rule", delta_memory([keys[0], keys[0]], [v1, v2]))]:
    print(f"{name:17s} recalls for k: {S.T @ keys[0]}")

# %% [markdown]
# Now a longer stream: 6 keys (random unit vectors in K = 16, so they overlap a little) and 48 writes.
# Each write either gives one of the keys a fresh random value (an update), or restates the value the
# key already has (the memory should not change). After every write we ask the memory for the *latest*
# value of every key seen so far.

# %%
K = V = 16
n_keys, T = 6, 48
keys = F.normalize(torch.randn(n_keys, K, **f64), dim=-1)
which = torch.randint(0, n_keys, (T,))
values = torch.randn(T, V, **f64)
restate = torch.rand(T) < 0.5                              # half of the writes repeat the current value

S_lin, S_delta = torch.zeros(K, V, **f64), torch.zeros(K, V, **f64)
latest = torch.zeros(n_keys, V, **f64)
err_lin, err_delta, write_lin, write_delta = [], [], [], []
for t in range(T):
    k = keys[which[t]]
    seen_before = bool((which[:t] == which[t]).any())
    if restate[t] and seen_before:
        values[t] = latest[which[t]]                       # "key 3 is still v": nothing new to store
    v = values[t]
    latest[which[t]] = v
    correction = v - S_delta.T @ k                       # what the memory gets wrong for this key
    write_lin.append(torch.outer(k, v).norm().item())
    write_delta.append(torch.outer(k, correction).norm().item())
    S_lin = S_lin + torch.outer(k, v)
    S_delta = S_delta + torch.outer(k, correction)       # β = 1, no decay
    seen = sorted(set(which[: t + 1].tolist()))
    rel = lambda S: ((keys[seen] @ S - latest[seen]).norm(dim=-1) / latest[seen].norm(dim=-1)).mean().item()  # noqa: E731
    err_lin.append(rel(S_lin)), err_delta.append(rel(S_delta))

# the hand-written loop above is the project's kda_recurrent with g = 0, beta = 1:
S_check = delta_memory(list(keys[which]), list(values))
print(f"loop vs kda_recurrent: max |diff| = {(S_check - S_delta).abs().max():.1e}")

facts.update(recall_error_linear=err_lin[-1], recall_error_delta=err_delta[-1])
fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.8))
a1.plot(err_lin, label="linear attention"), a1.plot(err_delta, label="delta rule")
a1.set_xlabel("writes"), a1.set_ylabel("relative recall error"), a1.legend(), integer_ticks(a1, "x")
a1.set_title("recall of the latest values, with overwrites")
a2.plot(write_lin, label="linear: ‖k vᵀ‖"), a2.plot(write_delta, label="delta: ‖k (v − Sᵀk)ᵀ‖")
repeat_at = [t for t in range(T) if restate[t] and (which[:t] == which[t]).any()]
a2.plot(repeat_at, [write_delta[t] for t in repeat_at], "k.", ms=8, label="restated values")
a2.set_xlabel("writes"), a2.set_ylabel("size of the write (Frobenius norm)"), a2.legend(), integer_ticks(a2, "x")
a2.set_title("the correction term")
plt.tight_layout(); plt.show()

# %% [markdown]
# Linear attention's error grows with every write: old values never leave, and a restated value is
# counted twice. The delta rule's error stays small; what is left comes from the keys overlapping
# (6 random directions in 16 dimensions are not exactly orthogonal). On the right: the delta rule writes
# the *error*, so a restated value costs little (black dots: only what the other keys' writes have
# blurred is repaired), while an update writes the whole difference between the new value and the old.
#
# ## 2. Forgetting: one rate per head (GDN) or per channel (KDA)
#
# The delta rule never forgets what it is not told to overwrite. Gated DeltaNet multiplies S by one
# α_t ∈ (0, 1] per head before writing; KDA multiplies **row d** of S (key channel d) by its own
# α_{t,d} = exp(g_{t,d}). The half-life of channel d is ln 2 / (−g_d) tokens: a channel with α ≈ 0.5 keeps
# information for about one token, one with α close to 1 for far longer than any prompt here. The cell
# prints the range this model uses, and how many channels sit at each end.

# %%
model, trained = load_model("small")
cfg = model.config
prompt = DEFAULT_PROMPT
ids, recs = trace(model, prompt)
layer = cfg.kda_layers[0]
kda_ev = [dict(rec.of("kda"))[layer] for rec in recs]             # one event per input token
g_tok = torch.stack([e["g"][0, 0] for e in kda_ev])                    # [T, H, K] log decay per token
half_life = math.log(2) / (-g_tok)
print(f"preset 'small', layer {layer} (KDA): {weights_note(trained)}")
print(f"prompt {prompt!r}: a recall line; the query after '|' asks for {expected_answer(prompt)!r}")
print(f"gate: K3's lower-bound form g = -5·σ(...) ∈ (-5, 0) (k3_facts.md §1c); "
      f"here g ∈ [{g_tok.min():.3f}, {g_tok.max():.3f}]")
short, long = float((half_life < 2).float().mean()), float((half_life > len(ids)).float().mean())
print(f"half-lives over all {half_life.numel():,} (token, head, channel) gates: {half_life.min():.1f} to "
      f"{half_life.max():,.0f} tokens (median {half_life.median():.1f}); {short:.0%} under 2 tokens, {long:.0%} "
      f"longer than this whole {len(ids)}-token prompt")
assert half_life.min() < 2 < len(ids) < half_life.max(), \
    "the take-away says some channels turn over within a token or two while others outlast the prompt"
facts.update(half_life_min=float(half_life.min()), half_life_max=float(half_life.max()),
             half_life_short_share=short, half_life_long_share=long)

fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4))
heatmap(a1, g_tok[:, 0].exp().T.numpy(), label="α = exp(g): kept per token", vmin=0, vmax=1,
        xlabel="token position", ylabel="key channel d (head 0)")
a1.set_title("KDA decay exp(g): one per channel"), integer_ticks(a1, "both")
t = np.arange(40)
for d in torch.argsort(g_tok[-1, 0])[[0, cfg.kda_head_dim // 2, -1]].tolist():
    a2.plot(t, np.exp(g_tok[-1, 0, d].item() * t), label=f"channel {d}: α = {g_tok[-1, 0, d].exp():.3f}")
a2.plot(t, np.exp(g_tok[-1, 0].mean().item() * t), "k--", label="one rate for the head (GDN-like)")
a2.set_xlabel("tokens later"), a2.set_ylabel("fraction of a write left"), a2.legend()
a2.set_title("per-channel memory spans")
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 3. Recurrent form = chunked form
#
# Token by token (`kda_recurrent`) is the definition, but it is a sequential loop. For prefill,
# `kda_chunked` computes the same thing a chunk at a time with the WY/UT transform (kda.md §2): within
# a chunk everything is a few matmuls and one triangular solve; only S is carried between chunks. The
# two agree to float64 rounding for any chunk size — T need not be a multiple of it:

# %%
shape = (1, 100, 2, 16)                                           # B, T, H, K; V = 8
inputs = dict(q=F.normalize(torch.randn(*shape, **f64), dim=-1), k=F.normalize(torch.randn(*shape, **f64), dim=-1),
              v=torch.randn(*shape[:3], 8, **f64),
              g=-5 * torch.sigmoid(torch.randn(*shape, **f64)),         # K3's bounded gate range (-5, 0)
              beta=torch.sigmoid(torch.randn(*shape[:3], **f64)))
S0 = torch.randn(1, 2, 16, 8, **f64)
o_rec, S_rec = kda_recurrent(**inputs, initial_state=S0, output_final_state=True)
print(f"T = {shape[1]}: chunk size | max |o_rec - o_chunk| | max |S_rec - S_chunk|")
for C in (1, 7, 16, 64, 128):
    o_ch, S_ch = kda_chunked(**inputs, initial_state=S0, output_final_state=True, chunk_size=C)
    print(f"   {C:4d}     | {(o_rec - o_ch).abs().max():.1e}            | {(S_rec - S_ch).abs().max():.1e}")

# %% [markdown]
# ## 4. Before the memory: a short convolution, and the tail it caches
#
# KDA does not feed q, k and v straight from their projections into the memory. Each channel first passes a
# **causal depthwise convolution of width W = 4** (kda.md §3): y_t = Σ_j w_j · x_{t−W+1+j}, j = 0 … W−1, then
# SiLU — every token mixed with the three before it, one small filter per channel. It is cheap local context:
# K3's MLA layers have no positional encoding, position comes from here and from the decay (k3_facts.md §1).
#
# To decode one token at a time, a layer must keep the last **W − 1 = 3 pre-convolution inputs** of q, k and v:
# the *conv tail*, part of the fixed decode state next to S (lesson 3, exercise 3.2, counts its bytes). Checked
# on the model's first KDA layer: ten tokens in one pass equal the same ten one at a time with the cached tail,
# and the tail is exactly the last three projected inputs.

# %%
kda_layer = model.blocks[layer].attn
x10 = torch.randn(1, 10, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
W = cfg.kda_conv_kernel
with torch.no_grad():
    y_once, state_once = kda_layer(x10)                       # one pass (the chunked form)
    cache, steps = None, []
    for t in range(10):                                       # one token at a time, carrying the cache
        y, cache = kda_layer(x10[:, t:t + 1], cache)
        steps.append(y)
    projected = torch.cat([kda_layer.q_proj(x10), kda_layer.k_proj(x10), kda_layer.v_proj(x10)], -1)
facts["conv_steps_vs_once"] = float((torch.cat(steps, 1) - y_once).abs().max())
facts["conv_tail_vs_last_inputs"] = float((cache.conv - projected[:, -(W - 1):]).abs().max())
facts["conv_tail_is_last_inputs"] = facts["conv_tail_vs_last_inputs"] < 1e-5
print(f"one pass vs token by token: max |diff| = {facts['conv_steps_vs_once']:.1e}")
print(f"cached tail {list(cache.conv.shape)} = [batch, W − 1, q|k|v channels]; vs the last {W - 1} projected "
      f"inputs: max |diff| = {facts['conv_tail_vs_last_inputs']:.1e}; state S {list(cache.state.shape)}")

fig, ax = plt.subplots(figsize=(12, 3.2))
heatmap(ax, kda_layer.k_conv.weight[:24, 0].detach().numpy().T, label="filter weight w_j", diverging=True,
        xlabel="k channel", ylabel="tap j (W−1 = the current token)")
ax.set_title(f"the learned short-conv filters of layer {layer}'s keys (first 24 channels)"), integer_ticks(ax, "both")
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 5. The state of a real KDA layer, token by token
#
# The small model's first KDA layer, head 0, decoding the prompt one token at a time. Each frame is
# the full memory S_t (K × V); it never grows, it only changes. `show_step(i)` draws token i with its
# decay per channel and its write strength β. The colours are symmetric around 0 (white) and clipped at the
# 99th percentile of |S|, so one large entry does not wash the rest out.

# %%
states = torch.stack([e["state"][0, 0] for e in kda_ev])        # [T, K, V] head 0
prev = [torch.zeros_like(states[0])] + list(states[:-1])
betas = torch.stack([e["beta"][0, 0, 0] for e in kda_ev])      # [T] head 0
lim = float(np.percentile(states.abs().numpy(), 99))           # one colour scale for every token


def show_step(i):
    fig, axes = plt.subplots(1, 3, figsize=(16, 4), gridspec_kw={"width_ratios": [1, 1, 1.1]})
    write = states[i] - g_tok[i, 0].exp()[:, None] * prev[i]
    heatmap(axes[0], states[i].numpy(), label="S entry", diverging=True, vmin=-lim, vmax=lim,
            xlabel="value channel", ylabel="key channel")
    axes[0].set_title(f"S after token {i} {token_text(ids[i])!r}")
    heatmap(axes[1], write.numpy(), label="write entry (own scale)", diverging=True,
            xlabel="value channel", ylabel="key channel")
    axes[1].set_title("the write: S_t − Diag(α) S_{t−1}")
    axes[2].bar(range(cfg.kda_head_dim), g_tok[i, 0].exp().numpy(), color="tab:green")
    axes[2].set_ylim(0, 1), axes[2].set_xlabel("key channel"), axes[2].set_ylabel("α = exp(g)")
    axes[2].set_title(f"decay per channel; β = {betas[i]:.3f}"), integer_ticks(axes[2], "x")
    for ax in axes[:2]:
        integer_ticks(ax, "both")
    plt.tight_layout(); plt.show()


step_slider(show_step, len(ids), start=len(ids) - 1, description="token")

# %%
show_step(4)   # the same helper without the slider, e.g. for a static copy of the notebook

# %%
fig, axes = plt.subplots(1, 6, figsize=(17, 3.6), sharey=True)
for ax, i in zip(axes, np.linspace(0, len(ids) - 1, 6).astype(int)):
    im = heatmap(ax, states[i].numpy(), label="S entry", diverging=True, vmin=-lim, vmax=lim, colorbar=False,
                 xlabel="value ch.", aspect="equal")
    ax.set_title(f"t={i} {token_text(ids[i])!r}"), integer_ticks(ax, "both")
axes[0].set_ylabel("key channel")
fig.colorbar(im, ax=list(axes), label="S entry (clipped at the 99th percentile)", extend="both", fraction=0.02)
fig.suptitle(f"S_t of layer {layer}, head 0 ({cfg.kda_head_dim}×{cfg.kda_head_dim}, float32): "
             "the same size at every token")
plt.show()
print(f"‖S_t‖_F per token: {' '.join(f'{s.norm():.3f}' for s in states)}")

# %% [markdown]
# ## 6. The memory at work: written at the definition, read back at the query
#
# The lesson's prompt is a recall line of the training corpus (`tiny_k3.corpus`): keys get single-digit values
# before the mark `|` (`a=3; q=8;`), some filler follows, and after the mark the model must give a key's value
# back (`| q=` → `8`). Between the two, the only way forward in a KDA layer is its state: some head must have
# *written* the value under a key when it read the definition, and *read it back* when the query came.
#
# `sim.recall_moment` (also `Simulation.recall_moment`, printed by `python -m sim`) replays the delta rule of
# every KDA head from the q, k, v, g, β the layer used (kda.md §1). The write of token d is
# u_d = β_d (v_d − S'ᵀ k_d) — what it stores under its key k_d, the correction of section 1 — and the read at
# the query t is r_t = S_tᵀ q_t (the layer's output is scale · r_t). A head whose read points the way of a write
# made inside the definition (cosine near 1) is returning what it stored there. Heads are ranked by the share of
# the read that the write *at the value token* explains, ⟨r_t, u_val⟩ / |r_t|² (the read splits exactly into one
# term per write, Σ_d a_d u_d), and the top one is named; the simulator names it as *the* reading head only when
# the model answers right and that share is at least 0.25 (`RecallMoment.reading_head`). Separately, the answer's logit margin over the other digits splits exactly into one share per
# sublayer (direct logit attribution through the AttnRes depth read, attnres.md §2): which sublayers *used* it.

# %%
from sim.recall_moment import delta_rule_reads_and_writes, recall_moment, recall_query_positions  # noqa: E402
from tiny_k3.recall import make_probes  # noqa: E402
from tiny_k3.tokenizer import decode  # noqa: E402

query_at = recall_query_positions(prompt)[-1]
moment = recall_moment(model, ids, query_at)
rq = moment.query
best = moment.reading_head or moment.best_head      # the head the simulator names; the best-ranked one if it names none
if moment.reading_head is None:
    print(f"the simulator names no reading head here: {moment.why_no_head}; below is the best-ranked head")
defined = list(rq.defined_at)


def reads_and_writes(layer_id):
    """The delta rule replayed for one KDA layer from the decode trace: (reads, writes), each [T, H, V]."""
    ev = [dict(rec.of("kda"))[layer_id] for rec in recs]
    return delta_rule_reads_and_writes(*(torch.cat([e[n][0] for e in ev]) for n in ("q", "k", "v", "g", "beta")))


def cosines_at_query(layer_id):
    """cos(r_query, u_d) for every head and every token d up to the query: [H, query_at + 1]."""
    reads, writes = reads_and_writes(layer_id)
    return F.cosine_similarity(reads[query_at][None], writes[: query_at + 1], dim=-1).T.numpy()


cos_by_layer = {lid: cosines_at_query(lid) for lid in cfg.kda_layers}
cosine = cos_by_layer[best.layer][best.head]                                    # [query_at + 1]
outside = [d for d in range(query_at) if d not in defined]                      # the query's own write left out
peak_at = int(np.argmax(cosine[:query_at]))
top = moment.top_moves(3)
facts.update(reading_head=None if moment.reading_head is None else [best.layer, best.head],
             recall_prompt=prompt, recall_value=rq.value, recall_predicted=moment.predicted,
             recall_right=moment.predicted == rq.value, best_head=[best.layer, best.head],
             best_cosine=best.cosine, best_written_at=best.written_at, defined_at=defined,
             cosine_peak_at=peak_at, peak_in_definition=peak_at in defined,
             best_outside=float(cosine[outside].max()),
             replay_matches_moment=abs(float(cosine[best.written_at]) - best.cosine) < 1e-4,
             top_move=top[0].label, top_move_layer=top[0].layer, top_move_margin=top[0].margin,
             margin=moment.margin, moves_sum=sum(m.margin for m in moment.moves))
text = lambda positions: "".join(token_text(ids[d]) for d in positions)   # noqa: E731
print(f"prompt {prompt!r}: the query {rq.key!r} at position {query_at} asks for {rq.value!r}, defined at "
      f"positions {defined[0]}–{defined[-1]} ({text(defined)!r}); the model answers {moment.predicted!r} "
      f"({'right' if facts['recall_right'] else 'wrong'})")
share_of = {(m.layer, m.head): m.share for m in moment.heads}
top_cos = {(lid, h): float(cos_by_layer[lid][h][defined].max()) for lid in cfg.kda_layers for h in range(cfg.kda_heads)}
panel_top = max(top_cos, key=top_cos.get)            # the longest red bar of the right-hand panel
facts.update(best_share=best.share, ranked_first=max(share_of, key=share_of.get) == (best.layer, best.head),
             panel_top_head=list(panel_top), panel_top_cosine=top_cos[panel_top])
print(f"best-ranked head: layer {best.layer}, head {best.head}, ranked by the share of its read at the query that "
      f"the write of the value token explains, ⟨r, u_val⟩ / |r|² = {best.share:.2f} (the largest of the "
      f"{len(moment.heads)} KDA heads); its read has cosine {best.cosine:.2f} with that write (position "
      f"{best.written_at}, {token_text(ids[best.written_at])!r})")
if panel_top != (best.layer, best.head):
    top_at = defined[int(np.argmax(cos_by_layer[panel_top[0]][panel_top[1]][defined]))]
    why = (f"the write of position {top_at} ({token_text(ids[top_at])!r}), not the value's: the value's write explains "
           f"{share_of[panel_top]:.2f} of its read" if top_at != best.written_at else
           f"the value's own write, yet that write explains only {share_of[panel_top]:.2f} of its read: a read can "
           "point the way of a write and still be mostly other writes")
    print(f"  the right-hand panel ranks nothing: it shows each head's best cosine with any write of the definition, "
          f"and there L{panel_top[0]} h{panel_top[1]} reaches {top_cos[panel_top]:.2f}, with {why}")
if facts["peak_in_definition"]:
    print(f"  and no token outside the definition matches it as well (best elsewhere: cosine "
          f"{facts['best_outside']:.2f}): the read at the query is, above all, what was written at the definition")
else:
    print(f"  but the write of position {peak_at} ({token_text(ids[peak_at])!r}, outside the definition) matches "
          f"it better (cosine {cosine[peak_at]:.2f}): this head's read is a blend, not a clean copy of one write")
print(f"the answer's margin over the other digits, {moment.margin:+.2f}, splits into one share per sublayer; the "
      f"largest: " + ", ".join(f"{m.label} {m.margin:+.2f}" for m in top))
own_attn = next(m for m in moment.moves if m.layer == best.layer and m.site == "attn")
if top[0].layer == best.layer and top[0].site == "attn":
    print(f"  the sublayer that pushes the answer up most is layer {best.layer}'s KDA attention: the same layer "
          "whose head reads the definition back")
elif top[0].layer == best.layer:
    print(f"  the largest share comes from layer {best.layer}'s MLP, the sublayer right after the KDA attention whose "
          f"head reads the definition back (that attention's own share: {own_attn.margin:+.2f})")
else:
    print(f"  the head that matches the definition best (layer {best.layer}) is not the sublayer that pushes the "
          f"answer up most ({top[0].label}): matching a write and using it are two measurements")

fig, (a1, a2) = plt.subplots(1, 2, figsize=(16, 4.2), gridspec_kw={"width_ratios": [2.2, 1]})
colors = ["crimson" if d in defined else "tab:blue" for d in range(query_at + 1)]
a1.bar(range(query_at + 1), cosine, color=colors)
a1.axvline(query_at, color="k", ls="--", lw=1, label="the query (its own write)")
a1.set_xticks(range(query_at + 1), [token_text(t) for t in ids[: query_at + 1]], fontsize=13)
for tick, t in zip(a1.get_xticklabels(), ids):
    tick.set_rotation(90 if len(token_text(t)) > 1 else 0)        # '<bos>' upright would cover its neighbour
a1.set_ylim(-1, 1), a1.axhline(0, color="grey", lw=0.5)
a1.set_xlabel("token d whose write u_d is compared (red: the definition)"), a1.set_ylabel("cos(r_query, u_d)")
a1.set_title(f"layer {best.layer}, head {best.head}: what the read at the query matches"), a1.legend(loc="lower left")
labels = [f"L{lid} h{h}" + (" (ranked 1st)" if (lid, h) == (best.layer, best.head) else "")
          for lid in cfg.kda_layers for h in range(cfg.kda_heads)]
inside_best = [cos_by_layer[lid][h][defined].max() for lid in cfg.kda_layers for h in range(cfg.kda_heads)]
outside_best = [cos_by_layer[lid][h][outside].max() for lid in cfg.kda_layers for h in range(cfg.kda_heads)]
y = np.arange(len(labels))[::-1]
a2.barh(y + 0.2, inside_best, 0.4, color="crimson", label="inside the definition")
a2.barh(y - 0.2, outside_best, 0.4, color="tab:blue", label="anywhere else")
a2.set_yticks(y, labels), a2.set_xlim(min(0.0, *inside_best, *outside_best) - 0.05, 1)
a2.set_xlabel("best cos(r_query, u_d)")
a2.set_title("each KDA head's best cosine\n(the ranking is by share, not by this)"), a2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
plt.tight_layout(); plt.show()

# %% [markdown]
# One prompt is one example. The same measurement on eight more recall lines of two pairs each (the corpus's own
# format, `tiny_k3.recall.make_probes`): is the answer right, which head ranks first (by the same share as above:
# how much of its read the value's write explains), and that head's cosine with the write.

# %%
rows = []
for probe in make_probes(8, 2, 16, seed=22):
    line_ids = probe.tokens.tolist()
    m = recall_moment(model, line_ids, probe.answer_at[0])          # the first query after the mark
    rows.append((m.predicted == m.query.value, (m.best_head.layer, m.best_head.head), m.best_head.cosine))
    print(f"{decode(line_ids[1:probe.answer_at[0] + 1])!r:62s} → {m.predicted!r} "
          f"({'right' if rows[-1][0] else 'wrong, ' + repr(m.query.value)}); ranked first by share: "
          f"L{m.best_head.layer} h{m.best_head.head} (share {m.best_head.share:.2f}, cosine {m.best_head.cosine:.2f})")
heads_seen = [r[1] for r in rows]
common = max(set(heads_seen), key=heads_seen.count)
facts.update(lines_right=sum(r[0] for r in rows), lines=len(rows), common_head=list(common),
             common_head_count=heads_seen.count(common), mean_best_cosine=float(np.mean([r[2] for r in rows])))
print(f"\nanswers right: {percent_ci(facts['lines_right'], len(rows))}; head L{common[0]} h{common[1]} ranks first "
      f"(by share) in {percent_ci(facts['common_head_count'], len(rows))} of the lines; the first-ranked heads' "
      f"mean cosine {facts['mean_best_cosine']:.2f} (eight lines: the intervals are wide, read them before the rates)")

# %% [markdown]
# Read the cosines with the printed verdicts. A read that matches a write made at the definition, across the
# filler in between, is the delta rule doing its job: the state is the same K × V matrix at every token, the
# write at the definition stored the value under a key, and the query's q finds that key again. Where the
# match is partial, the state holds a blend of many writes (section 1: keys that overlap blur each other) and the
# recall is spread over heads and layers. Lesson 3 asks how many such pairs a fixed-size state can hold, and
# what a cache that keeps every token costs instead.

# %% [markdown]
# ## Exercises
#
# ### Exercise 2.1 — one KDA step (★★★, about 15 min)
# One token, one head: decay each key row by its own exp(g_d), write the delta-rule correction, read
# the output from the updated state. (This is the inner loop of `kda_recurrent`, without the batch
# and head dimensions.) Stuck? `hint("2.1")` names the idea, `hint("2.1", 2)` the shape of the computation, `hint("2.1", 3)` the code.

# %% tags=["exercise"]
@exercise("kda_step")
def my_kda_step(S, q, k, v, g, beta, scale):
    """S [K, V], q, k, g [K], v [V], beta 0-d, scale float -> (o [V], S_new [K, V])."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_kda_step, my_kda_step)

# %% [markdown]
# ### Exercise 2.2 — the decay gate (★★☆, about 10 min)
# K3 keeps every decay in (−5, 0) with a bounded sigmoid; Kimi Linear used an unbounded softplus.
# Write both (kda.md §3).

# %% tags=["exercise"]
@exercise("kda_gate")
def my_kda_gate(g_raw, A_log, dt_bias, lower_bound):
    """g_raw [T, H, K], A_log [H], dt_bias [H*K], lower_bound float or None -> g [T, H, K]."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_kda_gate, my_kda_gate)

# %% [markdown]
# ### Exercise 2.3 — the read as a sum of past writes (★★☆, about 12 min)
# Section 6 compared the read at the query with every past write u_d. Here is why that comparison makes sense:
# unroll S_t = Diag(exp g_t) S_{t−1} + k_t u_tᵀ from S = 0, and the read S_tᵀ q is a weighted sum of the
# writes, Σ_d a_d u_d — KDA's read is attention over its own past writes. Find the weights a_d for one head.
# (`hint("2.3")`, then `hint("2.3", 2)` and `hint("2.3", 3)`.)

# %% tags=["exercise"]
@exercise("read_weights")
def my_read_weights(q, k, g):
    """q [K] (the query of token t), k, g [t+1, K] (tokens 0 … t) -> a [t+1]: S_tᵀ q = Σ_d a[d] u_d."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_read_weights, my_read_weights)

# %% [markdown]
# **Take-away.** KDA's memory is a K × V matrix per head that never grows. The delta rule keeps it
# accurate by writing only what it gets wrong; per-channel decay lets some channels outlast the whole prompt
# while others turn over within a token or two (section 2 printed the range and the share at each end). The recurrent loop (decode) and the chunked
# matmuls (prefill) are the same function. And whether a trained head really returns at the query what it wrote
# at the definition is not a belief but a measurement: the cosine of its read with each past write.

# %% [markdown]
# ## Build it yourself: a KDA layer's memory, from the step up
#
# The exercises above each wrote one piece. This thread builds pieces that compose, and then **runs the model on
# them**: B.1 the gated delta-rule step for every head at once; B.2 the chunked form, checked against tiny_k3
# *and against your own step*; B.3 one KDA head, your step over a sequence fed exactly as the layer feeds it
# (its q/k normalisation, its gate, its β). The cell after them puts your head into every KDA layer of the
# `small` model, then your chunked form as every KDA layer's prefill, and compares the model's logits on this
# lesson's prompt with its own each time. Everything here
# runs in float64, so "the same" is checked to 1e-9. Each exercise has three hints: `hint("B.1")` the idea,
# `hint("B.1", 2)` the shape of the computation, `hint("B.1", 3)` the code.

# %%
# (this section imports what it uses: it also runs on its own)
from checks.build import (CHUNK, against, check_delta_chunked, check_delta_step, check_kda_head,  # noqa: E402
                          run_your_layer)
from tiny_k3 import DEFAULT_PROMPT  # noqa: E402
from workshop import exercise, load_model, try_exercise, weights_note  # noqa: E402

print("the build thread: B.1 my_delta_step -> B.2 my_delta_chunked -> B.3 my_kda_head -> the model on your head")

# %% [markdown]
# ### Exercise B.1 — the delta-rule step, every head at once (★★☆, about 12 min)
# Exercise 2.1 for a whole layer's state S [H, K, V]: H heads side by side, each forgetting per key channel,
# writing its delta-rule error and reading its new state. No head sees another.

# %% tags=["build"]
@exercise("delta_step")
def my_delta_step(S, q, k, v, g, beta, scale):
    """S [H, K, V], q, k, g [H, K], v [H, V], beta [H], scale float -> (o [H, V], S_new [H, K, V])."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_delta_step, my_delta_step)

# %% [markdown]
# ### Exercise B.2 — the chunked form, checked against your own step (★★★, about 25 min)
# Prefill does not loop over tokens: it solves each chunk with matrix products (kda.md §2, the WY/UT form) and
# hands the state to the next chunk. Write it; the check compares it with `kda_chunked` and with your
# `my_delta_step` run token by token, which must be the same function.

# %% tags=["build"]
@exercise("delta_chunked")
def my_delta_chunked(q, k, v, g, beta, scale, chunk_size, S0=None):
    """q, k, g [T, H, K], v [T, H, V], beta [T, H], S0 [H, K, V] or None -> (o [T, H, V], S [H, K, V])."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(against(check_delta_chunked, step=my_delta_step), my_delta_chunked)

# %% [markdown]
# ### Exercise B.3 — a KDA head (★★☆, about 15 min)
# What a KDA layer hands each head after its projections and short convolution: raw q and k, v, the raw gate
# projection, the β logit and the head's gate parameters. Apply the layer's conventions (kda.md §3) and run
# *your* `my_delta_step` over the tokens.

# %% tags=["build"]
@exercise("kda_head")
def my_kda_head(q, k, v, g_raw, beta_logit, A_log, dt_bias, lower_bound, S0=None):
    """q, k [T, K] (not yet normalised), v [T, V], g_raw [T, K], beta_logit [T], A_log 0-d, dt_bias [K],
    lower_bound float or None, S0 [K, V] or None -> (o [T, V], S [K, V]). Use your my_delta_step."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_kda_head, my_kda_head)

# %% [markdown]
# ### The model on your head, then on your chunked form
# `tiny_k3.swap.swapped(model, kda_head=my_kda_head)` sends every head of every KDA layer through your function;
# the projections, short convolution, output norm and gate around it stay the layer's own, and the MLA layers
# are untouched. The second run does the same with your `my_delta_chunked` doing each head's whole prefill, in
# chunks of `checks.build.CHUNK` tokens, with the layer's own normalisation, gate and β
# around it (`checks.build.chunked_head`). The cell prints, for each run, the largest difference between the
# two runs' logits and the next token each predicts for the prompt.

# %%
build_model, build_trained = load_model("small")
build_model = build_model.double().eval()          # float64: the comparison can be held to 1e-9
print(f"small, {weights_note(build_trained)}, in float64")
print(f"your head goes into {len(build_model.config.kda_layers)} KDA layers × {build_model.config.kda_heads} heads:")
build_kda = run_your_layer(build_model, DEFAULT_PROMPT, kda_head=my_kda_head)
print(f"your chunked form as the prefill of every KDA head, {CHUNK} tokens a chunk:")
build_chunked = run_your_layer(build_model, DEFAULT_PROMPT, delta_chunked=my_delta_chunked)
