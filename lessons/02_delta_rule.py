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
# and every variant reads o_t = S_tᵀ (scale · q_t). In this lesson: the delta rule's correction made
# visible on an associative-recall task; what per-channel decay buys; the recurrent form equals the chunked
# form numerically; the short convolution in front of the memory and the tail it caches; and the state of a
# real KDA layer changing token by token.

# %%
import math

import numpy as np
import torch
import torch.nn.functional as F

from checks import check_kda_gate, check_kda_step, hint  # noqa: F401  (hint: for you)
from workshop import (exercise, heatmap, integer_ticks, load_model, plt, step_slider, trace,
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
# α_{t,d} = exp(g_{t,d}). A channel with α ≈ 1 keeps information for hundreds of tokens, a channel
# with α ≈ 0.5 for about one. The half-life of channel d is ln 2 / (−g_d) tokens.

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
print(f"gate: K3's lower-bound form g = -5·σ(...) ∈ (-5, 0) (k3_facts.md §1c); "
      f"here g ∈ [{g_tok.min():.3f}, {g_tok.max():.3f}]")
print(f"half-lives over all channels and tokens: {half_life.min():.1f} to {half_life.max():.0f} tokens "
      f"(median {half_life.median():.1f})")

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
# ## Exercises
#
# ### Exercise 2.1 — one KDA step (★★★, about 15 min)
# One token, one head: decay each key row by its own exp(g_d), write the delta-rule correction, read
# the output from the updated state. (This is the inner loop of `kda_recurrent`, without the batch
# and head dimensions.) Stuck? `hint("2.1")` names the idea, `hint("2.1", 2)` gives the formula.

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
# **Take-away.** KDA's memory is a K × V matrix per head that never grows. The delta rule keeps it
# accurate by writing only what it gets wrong; per-channel decay lets some channels hold on for
# hundreds of tokens while others turn over every few. And the recurrent loop (decode) and the
# chunked matmuls (prefill) are the same function.
