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
# # Lesson 0 — Attention and its cache, from scratch
#
# Everything K3 changes is measured against one baseline: **softmax attention with a KV cache**. Each token
# asks a question (its query), every earlier token offers a label (its key) and a content (its value); the
# answer is a mix of the contents, weighted by how well each label matches the question:
#
# $$\mathrm{out}_t = \sum_{s \le t} p_{t,s}\, v_s, \qquad p_{t,\cdot} = \mathrm{softmax}_s\!\left(\frac{q_t \cdot k_s}{\sqrt{D}}\right)$$
#
# (scaled dot-product attention: Vaswani et al. 2017; mla.md §1 has it in K3's form). To generate token t+1
# the model needs the keys and values of *every* token
# so far, so it keeps them: the **KV cache**, one more row per token, in every head of every layer. Lesson 2
# replaces most of those layers by a fixed-size state; lesson 3 shrinks the rest to a latent and counts what
# is saved. This lesson builds the thing they are compared with.
#
# In this lesson: rebuild the per-head queries, keys and values of a real layer of the trained `small` model,
# compute one attention read by hand and check it against the model; then all reads at once with a causal
# mask, through the project's own op; decode token by token with a cache and check that it equals recomputing
# everything; watch the cache grow and count its bytes, up to K3 at a million tokens.

# %%
import numpy as np
import torch

from checks import check_causal_attention, check_decode_step, check_kv_cache_bytes, hint  # noqa: F401  (hint: for you)
from workshop import (bar_labels, exercise, heatmap, integer_ticks, load_model, plt, step_slider, try_exercise,
                      weights_note)
from sim.costs import GPU_MEMORY
from sim.memory import MIB_CONTEXT, cache_bytes, format_bytes, mha_bytes_per_token, project_to_k3
from tiny_k3 import DEFAULT_PROMPT, TraceRecorder
from tiny_k3.mla import softmax_attention
from tiny_k3.tokenizer import encode, token_text

torch.manual_seed(0)
facts = {}                         # what the prose below claims, measured here (tests/test_lessons.py checks it)
model, trained = load_model("small")
cfg = model.config
ids = encode(DEFAULT_PROMPT)
labels = [token_text(i) for i in ids]
T = len(ids)
print(f"preset {cfg.name!r}, {weights_note(trained)}; prompt {DEFAULT_PROMPT!r}: {T} tokens (BOS first)")

# %% [markdown]
# ## 1. Queries, keys and values of a real layer
#
# K3's full-attention layers are gated MLA (lesson 3): they cache a compressed latent per token and rebuild
# each head's key and value from it. Rebuilt, they are exactly the per-head keys and values of plain attention,
# which is what we want here. We catch the input of the model's first MLA layer with a forward pre-hook and
# rebuild, with the layer's own weights, what a plain attention layer would compute and cache:
# q, k of `qk_head_dim` channels and v of `v_head_dim` channels per head. (This preset's MLA uses no
# rotary positions, `mla_rope=False`, as in K3: the key's shared part is used as it is.)

# %%
layer_index = cfg.mla_layers[0]
attn = model.blocks[layer_index].attn
captured = {}
hook = attn.register_forward_pre_hook(lambda module, args: captured.setdefault("x", args[0].detach()))
recorder = TraceRecorder()
with torch.no_grad():
    _, model_cache = model(torch.tensor([ids]), recorder=recorder)
hook.remove()
assert not cfg.mla_rope, "this lesson rebuilds keys without rotary positions"

H, nope, rope, Dv = cfg.mla_heads, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
D = nope + rope                                                        # the key width: qk_head_dim
x = captured["x"]                                                      # [1, T, hidden]: the layer's input
with torch.no_grad():
    q = attn.project_q(x)[0]                                           # [T, H, D]
    latent, k_shared = attn.kv_a_proj(x)[0].split([cfg.kv_lora_rank, rope], dim=-1)
    k_own, v = attn.kv_b_proj(attn.kv_norm(latent)).view(T, H, nope + Dv).split([nope, Dv], dim=-1)
    k = torch.cat([k_own, k_shared[:, None, :].expand(T, H, rope)], dim=-1)   # [T, H, D]
model_probs = dict(recorder.of("mla"))[layer_index]["probs"][0]        # [H, T, T]: what the model computed
print(f"layer {layer_index} ({cfg.layer_kinds[layer_index]}): q, k {list(q.shape)}, v {list(v.shape)}  "
      f"(T, heads, channels); the model's own attention weights {list(model_probs.shape)} (heads, queries, keys)")

# %% [markdown]
# ## 2. One read, by hand
#
# The last token, `=`, asks its question. For each head: dot its query with every key, scale by 1/√D, softmax
# over the keys, mix the values. Nothing else; the check is the model's own attention weights for that token.

# %%
t = T - 1
scores = torch.einsum("hd,shd->hs", q[t], k[: t + 1]) / D ** 0.5    # [H, t + 1]: one score per past token
weights = scores.softmax(dim=-1)                                     # [H, t + 1], each row sums to 1
read = torch.einsum("hs,shv->hv", weights, v[: t + 1])               # [H, Dv]: the mix of the values
facts["by_hand_vs_model"] = float((weights - model_probs[:, t, : t + 1]).abs().max())
top = weights.argmax(-1).tolist()
print(f"by hand vs the model's weights for token {t} ({labels[t]!r}): max |diff| = {facts['by_hand_vs_model']:.1e}")
print("where each head looks most: " + "; ".join(f"head {h} at token {s} {labels[s]!r} ({weights[h, s]:.0%})"
                                                for h, s in enumerate(top)))
facts["top_weight"] = [float(weights[h].max()) for h in range(H)]

fig, ax = plt.subplots(figsize=(12, 3.6))
width = 0.8 / H
for h in range(H):
    ax.bar(np.arange(t + 1) + (h - (H - 1) / 2) * width, weights[h].numpy(), width, label=f"head {h}")
ax.set_xticks(range(t + 1), [repr(s)[1:-1] or "·" for s in labels[: t + 1]])
ax.set_xlabel("key: the token it belongs to"), ax.set_ylabel("attention weight")
ax.set_title(f"token {t} {labels[t]!r} reads the past: softmax(q·k/√D) per head, layer {layer_index}")
ax.legend(loc="upper left")
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 3. Every read at once: the causal mask
#
# Training (and the prompt's prefill) computes all T reads in one go: a [T, T] matrix of scores per head, with
# the entries where a key comes *after* its query set to −∞ so that their weight is 0. That mask is what makes
# the model a left-to-right reader: no token sees its future. The project's attention op,
# `tiny_k3.mla.softmax_attention`, takes the mask as an argument; on our q, k, v it gives the model's weights.

# %%
causal = torch.arange(T)[None, :] <= torch.arange(T)[:, None]          # [T, T]: key s <= query t
with torch.no_grad():
    probs, full_out = softmax_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), D ** -0.5, causal)
full_out = full_out.transpose(0, 1)                                     # [T, H, Dv]
facts["op_vs_model"] = float((probs - model_probs).abs().max())
facts["op_vs_by_hand"] = float((full_out[t] - read).abs().max())
facts["future_weight"] = float(probs.masked_select(~causal).abs().max())
print(f"softmax_attention vs the model's weights: max |diff| = {facts['op_vs_model']:.1e}; its last read vs ours "
      f"by hand: {facts['op_vs_by_hand']:.1e}; largest weight on a future token: {facts['future_weight']:.1f}")

fig, axes = plt.subplots(1, H, figsize=(6 * H, 4.6))
for h, ax in enumerate(np.atleast_1d(axes)):
    heatmap(ax, probs[h].numpy(), label="attention weight", vmin=0, vmax=1, xlabel="key token s",
            ylabel="query token t")
    ax.set_title(f"head {h}: the upper triangle is the masked future")
    integer_ticks(ax, "both")
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 4. Decoding with a cache
#
# Generation goes one token at a time. Token t needs the keys and values of tokens 0 … t, and those of 0 … t−1
# have not changed since they were computed: keep them. Each step appends one row to the cache (the new
# token's k and v) and reads with the new query over all rows: **no mask is needed**, nothing in the cache
# lies in the future. Below, the decode loop over the prompt, with the one-read code of section 2, against the
# all-at-once reads of section 3.

# %%
K_cache, V_cache = torch.zeros(0, H, D), torch.zeros(0, H, Dv)        # an empty cache: no token yet
decoded, rows, held = [], [], []
for step in range(T):
    K_cache = torch.cat([K_cache, k[step][None]])                      # append first: token t reads itself
    V_cache = torch.cat([V_cache, v[step][None]])
    p = (torch.einsum("hd,shd->hs", q[step], K_cache) / D ** 0.5).softmax(-1)
    decoded.append(torch.einsum("hs,shv->hv", p, V_cache))
    rows.append(len(K_cache))
    held.append(K_cache.nbytes + V_cache.nbytes)                      # measured on the live tensors
decoded = torch.stack(decoded)                                         # [T, H, Dv]
facts["decode_vs_full"] = float((decoded - full_out).abs().max())
facts["cache_rows"] = rows
facts["bytes_held"] = held
per_token_layer = H * (D + Dv) * cfg.dtype_bytes
facts["bytes_per_token_layer"] = per_token_layer
print(f"token-by-token decode vs all reads at once: max |diff| = {facts['decode_vs_full']:.1e}")
print(f"the cache after each token holds {rows[0]}, {rows[1]}, {rows[2]}, … {rows[-1]} rows; each row costs "
      f"{H} heads × ({D} + {Dv}) values × {cfg.dtype_bytes} B = {per_token_layer} B")
facts["projections_cached"], facts["projections_recomputed"] = T, T * (T + 1) // 2
print(f"keys and values computed: {T} with the cache; {T * (T + 1) // 2} if every step recomputed its whole prefix")

# %% [markdown]
# `show_step(i)` shows the cache after token i: the keys it holds (head 0) and what token i read from them.

# %%
def show_step(i):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 4.0), gridspec_kw={"width_ratios": [1.3, 1]})
    heatmap(a1, k[: i + 1, 0].numpy(), label="key value", diverging=True, xlabel="key channel",
            ylabel="cached row = token")
    a1.set_title(f"after token {i} {labels[i]!r}: K cache of head 0, {i + 1} rows, "
                 f"{format_bytes(held[i])} (K and V, all heads)")
    integer_ticks(a1, "both")
    p = probs[:, i, : i + 1].numpy()
    for h in range(H):
        a2.plot(range(i + 1), p[h], "o-", label=f"head {h}")
    a2.set_xlabel("cached row = token"), a2.set_ylabel("weight in token i's read"), integer_ticks(a2, "x")
    a2.set_title(f"token {i} reads its {i + 1} rows"), a2.legend(loc="upper left")
    plt.tight_layout(); plt.show()


step_slider(show_step, T, start=T - 1, description="token")

# %%
show_step(4)

# %% [markdown]
# ## 5. What the cache costs
#
# One layer of one sequence holds `heads × (D + Dv)` values per token. A model whose every layer were plain
# attention would hold that in every layer: `sim.memory.mha_bytes_per_token` counts it, the baseline the
# other lessons compare with. Below: our measured bytes for one layer, times the layers, against that formula;
# what the `small` model really keeps (its MLA latents and its fixed KDA states, lesson 3); and the same three
# for the real K3 at 2^20 ≈ 1M tokens.

# %%
mha_small = [n * mha_bytes_per_token(cfg) for n in rows]
facts["measured_times_layers_is_formula"] = all(b * cfg.num_layers == m for b, m in zip(held, mha_small))
kv_real, state_real = cache_bytes(cfg, T)
facts["real_cache_measured"] = [model_cache.kv_bytes(), model_cache.state_bytes()]
facts["real_cache_formula"] = [kv_real, state_real]
print(f"small as plain attention, {cfg.num_layers} layers: measured one layer × {cfg.num_layers} == "
      f"mha_bytes_per_token × tokens at every step: {facts['measured_times_layers_is_formula']}")
print(f"after {T} tokens: plain attention {format_bytes(mha_small[-1])}; what small keeps: MLA latents "
      f"{format_bytes(model_cache.kv_bytes())} + KDA states {format_bytes(model_cache.state_bytes())} "
      "(measured on the model's cache, equal to sim.memory.cache_bytes)")

k3 = project_to_k3(MIB_CONTEXT)
facts["k3_1M"] = {"plain attention": k3.mha, "all-MLA twin": k3.twin, "K3 hybrid": k3.hybrid}
facts["k3_ratios"] = {"plain / twin": k3.mha / k3.twin, "plain / K3": k3.mha / k3.hybrid}
node = 8 * GPU_MEMORY["H200"]                                          # one 8-GPU node's memory
facts["plain_over_node"] = k3.mha / node
print(f"K3 at {MIB_CONTEXT:,} tokens, one sequence: plain attention {format_bytes(k3.mha)}, all-MLA twin "
      f"{format_bytes(k3.twin)}, K3 {format_bytes(k3.hybrid)}: the latent saves {k3.mha / k3.twin:.1f}x, the hybrid "
      f"{k3.mha / k3.hybrid:.1f}x against plain attention")
print(f"plain attention's cache alone is {k3.mha / node:.1f}x the {format_bytes(node)} of an 8×H200 node "
      "(sim.costs.GPU_MEMORY), before a single weight is loaded")

fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 4.2))
a1.plot(rows, np.array(held) * cfg.num_layers, "o", label=f"measured: one layer's cache × {cfg.num_layers} layers")
a1.plot(rows, mha_small, "k-", lw=1, label="sim.memory.mha_bytes_per_token × tokens")
a1.set_xlabel("tokens seen"), a1.set_ylabel("bytes held"), integer_ticks(a1, "x")
a1.set_title(f"preset {cfg.name!r} as plain attention: one row a token, every layer"), a1.legend(loc="upper left")
names = list(facts["k3_1M"])
bars = a2.bar(names, [facts["k3_1M"][n] / 1e9 for n in names], color=["tab:grey", "tab:red", "tab:blue"])
bar_labels(a2, bars, lambda gb: format_bytes(gb * 1e9))
a2.set_ylabel("GB for one sequence")
a2.set_title(f"K3 at {MIB_CONTEXT:,} tokens: the baseline, and what lessons 2-3 save")
plt.tight_layout(); plt.show()

# %% [markdown]
# The baseline grows by the same number of bytes with every token, forever: at a million tokens plain
# attention in K3's shape would need the amount in the left bar *per sequence*, several times what a whole
# 8-GPU node holds (printed above).
# Lesson 3 measures the other two bars on the running model.

# %% [markdown]
# ## Exercises
#
# ### Exercise 0.1 — causal softmax attention (★★☆, about 10 min)
# All T reads of section 3 at once, every head, with the causal mask: no token may read a later one.
# (`hint("0.1")` names the idea, `hint("0.1", 2)` the shape of the computation, `hint("0.1", 3)` the code.)

# %% tags=["exercise"]
@exercise("causal_attention")
def my_causal_attention(q, k, v):
    """q, k [T, H, D], v [T, H, Dv] -> out [T, H, Dv] (token t reads tokens 0 … t)."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_causal_attention, my_causal_attention)

# %% [markdown]
# ### Exercise 0.2 — one decode step with a KV cache (★★☆, about 12 min)
# Section 4's loop body as a function: the cache in, the new token's read and the grown cache out. The check
# decodes whole sequences from an empty cache and compares every read with exercise 0.1's all-at-once answer.

# %% tags=["exercise"]
@exercise("decode_step")
def my_decode_step(cache, q, k, v):
    """cache (K [t, H, D], V [t, H, Dv]); q, k [H, D], v [H, Dv] -> (o [H, Dv], (K, V) with t + 1 rows)."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_decode_step, my_decode_step)

# %% [markdown]
# ### Exercise 0.3 — the bytes of a plain KV cache (★☆☆, about 6 min)
# Section 5's baseline for any config, from the real K3 to the tiny presets.

# %% tags=["exercise"]
@exercise("kv_cache_bytes")
def my_kv_cache_bytes(config, tokens):
    """config: a K3Config, tokens: int -> bytes of plain attention's KV cache for one sequence (int)."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_kv_cache_bytes, my_kv_cache_bytes)

# %% [markdown]
# ### Your decode step, on the real layer
# Once exercise 0.2 passes, this cell decodes the prompt through layer 3's heads with *your* function and
# compares every read with the model's.

# %%
try:
    mine, cache = [], (torch.zeros(0, H, D), torch.zeros(0, H, Dv))
    for step in range(T):
        o, cache = my_decode_step(cache, q[step], k[step], v[step])
        mine.append(o)
    gap = float((torch.stack(mine) - full_out).abs().max())
    print(f"your decode step on layer {layer_index}'s real queries, keys and values: {len(cache[0])} cached rows, "
          f"max |your reads − the model's| = {gap:.1e}" + ("" if gap < 1e-4 else "  (not the model's: see 0.2)"))
except NotImplementedError:
    print("exercise 0.2 is not done yet: when it is, this cell runs your decode step on the model's own layer.")

# %% [markdown]
# **Take-away.** Attention reads a softmax-weighted mix of the values of every earlier token; to decode, a
# model keeps each token's keys and values, one row per token per head per layer, and the read from that cache
# equals recomputing everything. The price is linear in the context and paid in every layer: that is what
# K3's KDA layers (a fixed state, lesson 2) and MLA's latent (one small row for all heads, lesson 3) cut down.
