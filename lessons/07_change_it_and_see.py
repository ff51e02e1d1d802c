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
# # Lesson 7 — Change it and see
#
# Lessons 1–6 watched the model. Here we *change* it and watch what follows: knock out an expert, wipe
# a recurrent state, switch off the selection bias, flatten the depth weights, shorten the context. A
# mechanism is understood when you can predict what breaking it does.
#
# `Simulation.what_if(*changes, steps=n)` asks "what would the model have done here if …": it recomputes
# the cursor's frame from the decode state saved before it, with the changes in force, then `n - 1` more
# tokens, beside the original — and never touches the main timeline. The changes (`sim.interventions`):
#
# | change | what it changes | where in the forward pass |
# |---|---|---|
# | `AblateExpert(layer, expert)` | the expert can never be selected | router, before top-k (biased score → −∞) |
# | `ForceExperts(layer, experts)` | exactly these k experts | router, instead of top-k |
# | `NoSelectionBias(layer=None)` | select on topk(s), not topk(s + b) | router, before top-k |
# | `ResetState(layer=None, head=None)` | KDA state S and conv tail zeroed, once | KDA layer, before the cursor's token |
# | `ScaleDecay(layer=None, factor=…)` | g → factor · g | KDA layer, after the gate |
# | `UniformDepth(layer=None)` | depth weights 1/N | every AttnRes read (query w = 0) |
# | `TruncateContext(window)` | a query sees the last `window` tokens only | MLA causal mask |
#
# Every number below is computed on the shipped checkpoints when the cell runs; the sentences that
# depend on the model are printed from those numbers (and collected in `facts`).

# %%
import numpy as np
import torch
import torch.nn.functional as F

from checks import check_ablated_route, check_kl, check_reset_head, hint  # noqa: F401  (hint: for you)
from figures import depth_grid, percent_ci
from workshop import exercise, heatmap, integer_ticks, plt, step_slider, try_exercise
from sim import Simulation
from sim.interventions import (AblateExpert, NoSelectionBias, ResetState, TruncateContext, UniformDepth,
                               to_hooks)
from tiny_k3 import K3Config, TinyK3, TraceRecorder
from tiny_k3.corpus import DEFINITIONS, sample_corpus
from tiny_k3.tokenizer import decode, encode
from tiny_k3.weights import available_pretrained

facts = {}
KEY, KEY_VALUE = "m", "7"
RECALL = f"k=4; {KEY}={KEY_VALUE}; the red fox sees a box. | {KEY}="   # a recall line of the training corpus
sim = Simulation("small", RECALL, seed=0, twin=False)
cfg = sim.config
answer_id = encode(KEY_VALUE[0], bos=False)[0]
facts["recall_distance"] = len(encode(RECALL)) - len(encode(RECALL[:RECALL.index(KEY_VALUE)]))
print(sim, f"\nprompt: {RECALL!r}  (the right answer: {KEY_VALUE!r}, written {facts['recall_distance']} tokens "
      f"before the query)")

noop = sim.what_if(steps=1)
facts["noop_kl"] = noop.kl[0]
facts["noop_same"] = noop.frames[0].same_as(sim.frame) and np.array_equal(noop.logits_after[0], noop.logits_before[0])
print(f"what_if() with no change: KL {noop.kl[0]}, frame identical to the timeline's: {facts['noop_same']}")


# %% [markdown]
# ## 1. Wipe the memory at the recall query
#
# The value was written a few dozen tokens before the query (printed above). At `m=` the model must fetch it. Two memories
# could hold it: the **KDA states** (fixed size, lesson 2) and the **MLA caches** (every token, lesson 3).
# `ResetState()` wipes all KDA states just before the query token; `TruncateContext(1)` blinds the MLA
# layers to everything but the current token; both together leave the model nothing. Three generated
# tokens each.

# %%
def p_answer(logits) -> float:
    z = logits.astype(np.float64)
    p = np.exp(z - z.max())
    return float(p[answer_id] / p.sum())


conditions = {"original": (), "reset KDA": (ResetState(),), "MLA window 1": (TruncateContext(1),),
              "both": (ResetState(), TruncateContext(1))}
recall = {name: sim.what_if(*changes, steps=3) for name, changes in conditions.items()}
for name, w in recall.items():
    print(f"{name:13s} -> {w.text_after!r:8s} p({KEY_VALUE[0]!r}) = {p_answer(w.logits_after[0]):.3f}  "
          f"KL {w.kl[0]:.4f}  first divergence: {w.first_divergence[0]}")

base = recall["original"]
facts["recall_right"] = base.text_after.startswith(KEY_VALUE)
facts["recall_p"] = {name: p_answer(w.logits_after[0]) for name, w in recall.items()}
facts["reset_survives"] = recall["reset KDA"].text_after[:1] == base.text_after[:1]
facts["reset_kl"], facts["window_kl"] = recall["reset KDA"].kl[0], recall["MLA window 1"].kl[0]
print(f"\nThe hybrid answers {base.text_after[:1]!r}: {'right' if facts['recall_right'] else 'wrong'} "
      f"(p = {facts['recall_p']['original']:.3f}; chance among 10 digits is 0.1).")
print(f"Wiping every KDA state {'leaves the answer as it was' if facts['reset_survives'] else 'changes the answer'} "
      f"(KL {facts['reset_kl']:.4f}); blinding the MLA layers moves it by KL {facts['window_kl']:.5f}.")

# %% [markdown]
# The all-KDA model `small-kda` (lesson 3's ablation) has no MLA cache at all: after a reset it keeps
# nothing of the prompt but the current token. The cell below runs the same experiment on it (and says so
# instead if its checkpoint is missing from this copy).

# %%
KDA_ONLY = "small-kda"
facts["kda_only_present"] = KDA_ONLY in K3Config.presets() and KDA_ONLY in available_pretrained()
if facts["kda_only_present"]:
    lin = Simulation(KDA_ONLY, RECALL, seed=0, twin=False)
    lin_base, lin_reset = lin.what_if(steps=3), lin.what_if(ResetState(), steps=3)
    facts["kda_only_p"] = {"original": p_answer(lin_base.logits_after[0]),
                           "reset KDA": p_answer(lin_reset.logits_after[0])}
    facts["kda_only_reset_kl"] = lin_reset.kl[0]
    print(f"{KDA_ONLY}: original -> {lin_base.text_after!r} (p = {facts['kda_only_p']['original']:.3f}); after the "
          f"reset -> {lin_reset.text_after!r} (p = {facts['kda_only_p']['reset KDA']:.3f}, KL {lin_reset.kl[0]:.4f})")
else:
    print(f"the {KDA_ONLY!r} checkpoint is missing from this copy (have: {', '.join(available_pretrained())}); "
          f"it ships with tiny_k3, so restore the copy's tiny_k3/ folder and re-run this cell.")

fig, ax = plt.subplots(figsize=(8, 3.2))
models = {"small (hybrid)": facts["recall_p"]}
if facts["kda_only_present"]:
    models[KDA_ONLY] = facts["kda_only_p"]
names = list(conditions)
for j, (model_name, ps) in enumerate(models.items()):
    ax.bar(np.arange(len(names)) + 0.38 * j, [ps.get(n, np.nan) for n in names], width=0.36, label=model_name)
ax.axhline(0.1, color="grey", ls="--", lw=1, label="chance (1 of 10 digits)")
ax.set_xticks(np.arange(len(names)) + 0.19 * (len(models) - 1), names)
ax.set_xlabel("what was wiped just before the query token"), ax.set_ylabel(f"p(next = {KEY_VALUE[0]!r})")
ax.set_title(f"recall of {KEY}={KEY_VALUE} at the query"), ax.legend()
plt.tight_layout(); plt.show()

# %% [markdown]
# **Why.** A reset zeroes S in every KDA layer but leaves the MLA layers' caches whole: in principle the
# prompt can come back through them. Whether it does is a property of the trained model — compare the
# two KLs: the one that moves the prediction more is the memory this checkpoint actually reads. An
# all-KDA model has no second copy at all. And an answer can only "survive" if the model recalled it in
# the first place: the printed lines say whether it did.

# %%
def ratio_text(big: float, small: float) -> str:
    """'37x', or 'over 1,000x' when the smaller KL is (nearly) zero and the quotient means nothing."""
    return "over 1,000x" if big > 1000 * small else f"{big / small:.0f}x"


reads_kda = facts["reset_kl"] > 10 * facts["window_kl"]
facts["memory_in_kda"] = reads_kda
print("This checkpoint reads the prompt through its " + ("KDA states: wiping them moves the prediction "
      f"{ratio_text(facts['reset_kl'], facts['window_kl'])} more than blinding the MLA layers, so the MLA "
      "cache does not rescue a reset here." if reads_kda else "MLA caches as much as through its KDA states: "
      "blinding the MLA layers matters about as much as a reset."))

# %% [markdown]
# ### The same two experiments where the pairs pile up
#
# One query on a short prompt is one case. Lesson 3 showed a fixed state running out of room as the pairs pile
# up; if the MLA layers are there to carry what the state cannot, it should show on lines with many pairs. The
# same two cuts, on many recall lines at once (`tiny_k3.recall`): *MLA blind* drops the definitions' rows from
# both MLA caches just before the queries (under NoPE that is exact masking), *KDA reset* wipes every state
# there. Each cell is exact recall over all the answers of the lines, with its Wilson 95 % interval. That interval
# counts answers, and the answers of one line share its state: with 4 lines at 52 pairs they are not 208
# independent draws, so read it as the least the uncertainty can be, and a small gap as no gap.

# %%
from tiny_k3.recall import (Score, compare, edited_recall_hits, hide_definitions_from_mla,  # noqa: E402
                            make_probes, reset_kda_states)

MANY = {2: make_probes(8, 2, 16, seed=71), 52: make_probes(4, 52, 16, seed=73)}   # 16 and 208 answers
cuts = {"intact": None, "MLA blind": hide_definitions_from_mla, "KDA reset": reset_kda_states()}
many = {cut: {n: edited_recall_hits(sim.model, lines, edit) for n, lines in MANY.items()} for cut, edit in cuts.items()}
print(f"{'pairs (16 filler)':18s}" + "".join(f"{n:>16d}" for n in MANY))
for cut, cells in many.items():
    print(f"{cut:18s}" + "".join(str(Score(h, a)).rjust(16) for h, a in cells.values()))
share = {cut: {n: h / a for n, (h, a) in cells.items()} for cut, cells in many.items()}
signed = lambda x: "+0 points" if round(100 * x) == 0 else f"{100 * x:+.0f} points"  # noqa: E731
facts["many_pairs"] = share
drop = {n: share["intact"][n] - share["MLA blind"][n] for n in MANY}
facts["mla_blind_drop"] = drop
# "carry": blinding costs >= 20 points at 52 pairs, with intact and blind intervals apart; "the KDA states hold the
# few pairs": it costs <= 5 at 2
carried = drop[52] >= 0.2 and compare(Score(*many["intact"][52]), Score(*many["MLA blind"][52])) > 0
kda_holds_few = drop[2] <= 0.05
facts["mla_carries_many_pairs"], facts["kda_holds_few_pairs"] = carried, kda_holds_few
ci = lambda cut, n: percent_ci(*many[cut][n])  # noqa: E731   (hits, answers): rate, Wilson 95 %, n
state = f"a state of {sim.config.kda_head_dim} x {sim.config.kda_head_dim} per head"
if carried and kda_holds_few:
    reading_many = (f"at many pairs the MLA layers carry recall: blinding them costs {drop[52]:.0%} at 52 pairs "
                    f"({ci('intact', 52)} -> {ci('MLA blind', 52)}) but only {signed(drop[2])} at 2 "
                    f"({ci('intact', 2)} -> {ci('MLA blind', 2)}), where the KDA states hold it; more pairs than "
                    f"{state} can keep apart")
elif carried:
    reading_many = (f"the MLA layers carry recall at every pair count here: blinding them costs {drop[52]:.0%} at "
                    f"52 pairs ({ci('intact', 52)} -> {ci('MLA blind', 52)}), more pairs than {state} can keep "
                    f"apart, and {drop[2]:.0%} at 2 ({ci('intact', 2)} -> {ci('MLA blind', 2)}), which a state "
                    f"could hold: this checkpoint keys every look-up on its MLA layers (a KDA reset leaves "
                    f"{ci('KDA reset', 2)} at 2 pairs and {ci('KDA reset', 52)} at 52)")
else:
    reading_many = (f"in this checkpoint the MLA layers carry little recall even at many pairs: blinding them "
                    f"changes exact recall by {signed(-drop[2])} at 2 pairs and {signed(-drop[52])} at 52 (intact "
                    f"{ci('intact', 52)}, blind {ci('MLA blind', 52)}), while a KDA reset sends it to "
                    f"{ci('KDA reset', 52)} at 52")
print("• " + reading_many)

# %% [markdown]
# Step through the reset what-if token by token: top-5 before and after, and where it first diverged.

# %%
reset = recall["reset KDA"]


def show_step(s, w=reset):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 2.8), sharex=True)
    for ax, top, title in ((a1, w.top_before[s], "original"), (a2, w.top_after[s], "KDA states wiped")):
        ax.barh([repr(t) for _, t, _ in top][::-1], [p for _, _, p in top][::-1], color="tab:blue")
        ax.set_xlabel("probability"), ax.set_ylabel("next token"), ax.set_title(f"step {s}: {title}")
    fig.suptitle(f"KL {w.kl[s]:.4f} nats · first divergence: {w.first_divergence[s]}")
    plt.tight_layout(); plt.show()


step_slider(show_step, reset.steps, description="step")

# %% [markdown]
# ## 2. Knock out the most used expert
#
# Over a held-out stretch of the training corpus (256 tokens, one prefill each), find the expert of
# layer 4 that took the most tokens, ablate it, and measure the loss and who takes its tokens.
# `to_hooks` turns the same changes into the model's plain hooks, so a whole sequence runs at once.

# %%
text_ids = torch.tensor([encode(sample_corpus(1200, seed=123457))[:256]])


@torch.no_grad()
def run(model, changes=(), record=False):
    """(loss in nats per token, {MoE layer: expert ids [T, k]}) of the held-out text under the changes."""
    rec = TraceRecorder() if record else None
    logits, _ = model(text_ids, recorder=rec, hooks=to_hooks(changes, model.config) if changes else None)
    loss = float(F.cross_entropy(logits[0, :-1].float(), text_ids[0, 1:]))
    return loss, ({layer: d["expert_ids"][0] for layer, d in rec.of("moe")} if record else None)


LAYER = 4
loss0, ids0 = run(sim.model, record=True)
load0 = {layer: torch.bincount(i.flatten(), minlength=cfg.num_experts) for layer, i in ids0.items()}
top = int(load0[LAYER].argmax())
loss_ablate, ids_ablate = run(sim.model, [AblateExpert(LAYER, top)], record=True)
hit = (ids0[LAYER] == top).any(-1)                                       # tokens that used it
took = [e for a, b in zip(ids0[LAYER][hit], ids_ablate[LAYER][hit]) for e in set(b.tolist()) - set(a.tolist())]
heir, heir_n = (int(np.bincount(took).argmax()), int(np.bincount(took).max())) if took else (None, 0)
facts.update(ablated=top, ablated_tokens=int(hit.sum()), loss=loss0, loss_ablate=loss_ablate, heir=heir,
             heir_tokens=heir_n, ablated_never_chosen=not bool((ids_ablate[LAYER] == top).any()))
print(f"layer {LAYER}: expert {top} took {percent_ci(int(hit.sum()), text_ids.shape[1])} of the tokens "
      f"(the mean expert takes k / N = {cfg.top_k / cfg.num_experts:.1%})")
print(f"loss {loss0:.4f} -> {loss_ablate:.4f} nats/token (Δ {loss_ablate - loss0:+.5f}); chosen after the "
      f"ablation: never ({facts['ablated_never_chosen']})")
print(f"its tokens went to {len(set(took))} different experts; the most common heir, expert {heir}, took {heir_n}")

after = torch.bincount(ids_ablate[LAYER].flatten(), minlength=cfg.num_experts)
heirs = sorted(set(took))                                               # every expert that took one of its slots
busiest = torch.argsort(load0[LAYER], descending=True)[:12].tolist()
show = sorted(set(busiest) | set(heirs), key=lambda e: -int(load0[LAYER][e]))   # the busiest 12 and every heir
fig, ax = plt.subplots(figsize=(12, 3.6))
x = np.arange(len(show))
ax.bar(x - 0.2, load0[LAYER][show].numpy(), 0.4, label="original", color="tab:grey")
ax.bar(x + 0.2, after[show].numpy(), 0.4, label=f"expert {top} ablated", color="tab:red")
ax.set_xticks(x, [str(int(e)) for e in show], rotation=90)
for tick, e in zip(ax.get_xticklabels(), show):
    if e in heirs:
        tick.set_color("tab:red"), tick.set_fontweight("bold")
ax.set_xlabel(f"expert id (layer {LAYER}): the 12 busiest and, in red, the {len(heirs)} that took over its slots")
ax.set_ylabel("tokens routed"), integer_ticks(ax, "y")
ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))                  # beside the plot: it covers no bar
ax.set_title(f"who takes over when expert {top} is gone")
plt.tight_layout(); plt.show()

# %% [markdown]
# One expert of 896 is 0.11% of the layer's routed parameters, and its 16 slots per token are shared
# with 15 others and the shared experts: the next in line does nearly the same job. That redundancy is
# what fine-grained MoE buys (lesson 1's granularity family).
#
# ## 3. Switch off the selection bias
#
# The bias b was trained only to balance the load (aux-loss-free, lesson 1). Route the same text on the
# unbiased scores alone and count tokens per expert: max load / mean load (1 = perfectly even) and how
# many experts sit idle.

# %%
loss_nobias, ids_nobias = run(sim.model, [NoSelectionBias()], record=True)
load1 = {layer: torch.bincount(i.flatten(), minlength=cfg.num_experts) for layer, i in ids_nobias.items()}
layers = sorted(load0)
ratio = lambda load: float(load.max() / load.float().mean())  # noqa: E731
facts["balance_before"] = [ratio(load0[layer]) for layer in layers]
facts["balance_after"] = [ratio(load1[layer]) for layer in layers]
facts["idle_before"] = [int((load0[layer] == 0).sum()) for layer in layers]
facts["idle_after"] = [int((load1[layer] == 0).sum()) for layer in layers]
facts["loss_nobias"] = loss_nobias
for layer, b, a, i0, i1 in zip(layers, facts["balance_before"], facts["balance_after"], facts["idle_before"],
                               facts["idle_after"]):
    print(f"L{layer}: max/mean load {b:5.2f} -> {a:5.2f}   idle experts {i0:3d} -> {i1:3d} of {cfg.num_experts}")
print(f"loss {loss0:.4f} -> {loss_nobias:.4f} nats/token without the bias")


def concentration(load):
    """(the fewest experts that take half of the layer's routed slots, the 10 busiest experts' share of them)."""
    busiest = torch.sort(load, descending=True).values.double()
    return int((busiest.cumsum(0) < busiest.sum() / 2).sum()) + 1, float(busiest[:10].sum() / busiest.sum())


(half0, top0), (half1, top1) = concentration(load0[LAYER]), concentration(load1[LAYER])
facts.update(half_slots_before=half0, half_slots_after=half1, top10_share_before=top0, top10_share_after=top1)
print(f"L{LAYER} without the bias: half of its {int(load1[LAYER].sum()):,} routed slots go to its {half1} busiest "
      f"experts ({half0} with the bias), the 10 busiest take {top1:.1%} of them ({top0:.1%} with the bias; an even "
      f"load gives {10 / cfg.num_experts:.1%}), and {facts['idle_after'][layers.index(LAYER)]} of {cfg.num_experts} "
      f"experts take none ({facts['idle_before'][layers.index(LAYER)]} with the bias)")
k = cfg.top_k
kept = np.mean([len(set(a.tolist()) & set(b.tolist())) / k for layer in layers
                for a, b in zip(ids0[layer], ids_nobias[layer])])          # experts a token keeps, on average
new_picks = [e for layer in layers for a, b in zip(ids0[layer], ids_nobias[layer]) for e in set(b.tolist()) - set(a.tolist())]
new_layers = [layer for layer in layers for a, b in zip(ids0[layer], ids_nobias[layer]) for _ in set(b.tolist()) - set(a.tolist())]
rare = np.mean([int(load0[layer][e]) <= 1 for layer, e in zip(new_layers, new_picks)]) if new_picks else 0.0
# The interval is over TOKENS, not picks: one token's new picks in every MoE layer move together, and many tokens
# pick the same expert, so the picks are not independent draws. Resample the tokens (each with all its picks).
n_text = text_ids.shape[1]
rare_by_token, new_by_token = np.zeros(n_text), np.zeros(n_text)
for layer in layers:
    for t, (a, b) in enumerate(zip(ids0[layer], ids_nobias[layer])):
        for e in set(b.tolist()) - set(a.tolist()):
            new_by_token[t] += 1
            rare_by_token[t] += int(load0[layer][e]) <= 1
draws = np.random.default_rng(0).integers(0, n_text, size=(2000, n_text))
rare_lo, rare_hi = np.percentile(rare_by_token[draws].sum(1) / np.maximum(new_by_token[draws].sum(1), 1), [2.5, 97.5])
facts.update(nobias_kept_share=float(kept), nobias_new_to_rare=float(rare), new_to_rare_interval=[rare_lo, rare_hi],
             new_picks=len(new_picks), new_picks_by_token=int(new_by_token.sum()), interval_tokens=n_text)
assert loss_nobias > loss0, "switching off the bias changes which experts run, so the output (and loss) changes"
print(f"without the bias a token keeps {kept:.0%} of its {k} experts on average (over {sum(map(len, ids0.values())):,} "
      f"token-layers); of the tokens' {len(new_picks):,} picks of an expert they did not have before, {rare:.0%} went to "
      f"experts that took at most one token of this text with the bias on (95 % interval {100 * rare_lo:.0f}–{100 * rare_hi:.0f} %, from resampling the "
      f"{n_text} tokens with all their picks: the picks are not {len(new_picks):,} independent draws)")

fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.4))
x = np.arange(len(layers))
a1.bar(x - 0.2, facts["balance_before"], 0.4, label="with bias (as trained)")
a1.bar(x + 0.2, facts["balance_after"], 0.4, label="no bias")
a1.set_xticks(x, [f"L{layer}" for layer in layers]), a1.set_xlabel("MoE layer"), a1.set_ylabel("max load / mean load")
a1.set_ylim(0, 1.3 * max(facts["balance_after"])), a1.legend(loc="upper left", ncol=2)   # above the bars
a1.set_title("load balance")
for load, label in ((load0[LAYER], "with bias"), (load1[LAYER], "no bias")):
    a2.plot(np.sort(load.numpy())[::-1], label=label)
a2.set_yscale("symlog"), a2.set_xlabel(f"experts of L{LAYER}, busiest first"), a2.set_ylabel("tokens routed")
a2.legend(), a2.set_title("load per expert")
plt.tight_layout(); plt.show()

# %% [markdown]
# Without the bias the load piles onto the experts the router happens to like, and hundreds sit idle (the counts
# are printed above: how few experts take half of the slots, the ten busiest ones' share, the idle ones). The bias
# is what spreads the work (and in an expert-parallel deployment, what keeps one GPU from doing the work of four).
#
# And the loss changes by a lot (the line above), although lesson 1 showed the bias never enters the weights
# w = s[ids] / Σ s[ids]. It does not need to: it decides *who* runs, and a different who is a different
# function. The model was trained with the bias on, so each expert learned from the tokens the biased router sent
# it; switch the bias off and a token keeps only part of its experts (the share printed above), and many of the
# experts it gets instead hardly ever saw such a token. "No effect on the output" holds for the weights of a
# given choice, not for the choice.
#
# ## 4. Uniform depth weights: take the trained ones out
#
# `UniformDepth()` sets every Attention Residuals query to zero: each sublayer reads the plain mean of
# its sources, the standard-residual picture AttnRes starts from (lesson 4). Left, the learned weights at
# the recall query; right, the loss with and without them.

# %%
loss_uniform, _ = run(sim.model, [UniformDepth()])
flat = sim.what_if(UniformDepth())
facts.update(loss_uniform=loss_uniform, uniform_kl=flat.kl[0])
reads = [d for d in sim.frame.depth if d.weights.size]
grid, columns = depth_grid([(d.layer, d.site, d.weights) for d in reads], cfg.attnres_block_size, cfg.num_layers)
print(f"loss {loss0:.4f} -> {loss_uniform:.4f} nats/token with uniform depth weights; at the query, KL "
      f"{flat.kl[0]:.3f} and the top token {flat.top_before[0][0][1]!r} -> {flat.top_after[0][0][1]!r}")

fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 6), gridspec_kw={"width_ratios": [1.3, 1]})
heatmap(a1, grid, label="depth weight α (rows sum to 1)", vmin=0, vmax=1, cmap="viridis",
        xlabel="source (embedding, block sums, partial)", ylabel="depth read")
a1.set_yticks(range(len(reads)), [f"L{d.layer} {d.site}" for d in reads])
a1.set_xticks(range(len(columns)), columns)
a1.set_title("learned depth weights at the query (uniform would be 1/N)")
a2.bar(["as trained", "uniform (w = 0)"], [loss0, loss_uniform], color=["tab:blue", "tab:orange"])
a2.set_ylabel("held-out loss (nats/token)"), a2.set_title("the trained depth weights taken out")
plt.tight_layout(); plt.show()

# %% [markdown]
# Read the gap with care. It is **not** what AttnRes is worth: every other weight was trained together with
# these depth weights and expects their mix, so taking them out breaks what the rest co-adapted to, as taking out
# any trained part would. What AttnRes is worth is a comparison of two models, each
# *trained* with and without it at the same compute: that is the paper's scaling-law result (lesson 4, section 5),
# which no intervention on one trained model can measure.

# %% [markdown]
# ## 5. Truncate the context: when does the twin start to forget?
#
# The all-MLA twin keeps its whole memory in KV caches; the hybrid keeps most of it in KDA states.
# `TruncateContext(window)` lets every MLA layer see only the last `window` tokens. Sweep the window
# on the held-out text, for both models (the twin's checkpoint `small-twin` ships beside the hybrid).

# %%
twin = TinyK3.from_pretrained("small-twin").eval() if "small-twin" in available_pretrained() else None
windows = [1, 4, 16, 64, 256]
curve = {"small (hybrid)": [run(sim.model, [TruncateContext(w)])[0] for w in windows]}
if twin is not None:
    curve["small-twin (all MLA)"] = [run(twin, [TruncateContext(w)])[0] for w in windows]
full = {name: losses[-1] for name, losses in curve.items()}        # window 256 = the whole text: no change
for name, losses in curve.items():
    print(f"{name:21s} " + "  ".join(f"w={w}: {v:.3f}" for w, v in zip(windows, losses)))
forget = {name: max((w for w, v in zip(windows, losses) if v - full[name] > 0.05), default=None)
          for name, losses in curve.items()}
facts.update(window_losses=curve, forget_window=forget)
for name, w in forget.items():
    print(f"{name}: " + (f"loses more than 0.05 nats/token once the window is {w} tokens or fewer" if w else
                         "never loses 0.05 nats/token, even at a window of 1"))
gaps = {name: losses[0] - full[name] for name, losses in curve.items()}       # window 1 against the whole text
facts["window_gaps"] = gaps
print("at a window of 1: " + ", ".join(f"{name} {gap:+.3f} nats/token" for name, gap in gaps.items()))
# how many pairs the recall lines of this text define (DEFINITIONS: the "k=v; ..." run that opens such a line)
text_pairs = [m.group().count(b"=") for m in DEFINITIONS.finditer(decode(text_ids[0].tolist()).encode())]
facts["text_pairs"], facts["window_costs_hybrid"] = text_pairs, gaps["small (hybrid)"] > 0.01
print(f"the recall lines of this text define {', '.join(map(str, text_pairs))} pairs; blinding the hybrid's MLA "
      f"cost {100 * drop[2]:.0f} points at 2 pairs in section 1 and {100 * drop[52]:.0f} at 52")
hybrid_gap, twin_gap = gaps["small (hybrid)"], gaps.get("small-twin (all MLA)")
if hybrid_gap <= 0.01:
    print(f"the hybrid loses nothing to a window of 1 here ({hybrid_gap:+.3f} nats/token): its KDA states hold "
          f"this text's past, the few-pair look-ups included")
else:
    print(f"the hybrid loses {hybrid_gap:.3f} nats/token to a window of 1 here" +
          (f", {hybrid_gap / twin_gap:.0%} of the twin's {twin_gap:.2f}" if twin_gap else ""))

fig, ax = plt.subplots(figsize=(7, 3.2))
for name, losses in curve.items():
    ax.plot(windows, losses, marker="o", label=name)
ax.set_xscale("log", base=2), ax.set_xlabel("MLA window (tokens)"), ax.set_ylabel("held-out loss (nats/token)")
ax.set_title("a sliding window: who forgets"), ax.legend()
plt.tight_layout(); plt.show()

# %% [markdown]
# The twin has nothing but its KV caches, so a short window starves it. The hybrid loses little or nothing (the
# last lines above say which, computed), because its KDA layers carry the past in their fixed states. What a
# window can take from the hybrid is what its MLA layers carry, and section 1 found where that is: the look-ups
# of lines with many pairs, more than its states keep apart. This text's recall lines define only a few pairs
# each, the kind its states hold by themselves, so its MLA layers have little here that only they know. That is
# the other side of lesson 3: the fixed state is not only smaller, it is where this hybrid keeps most of its
# memory, and the few MLA layers are where it keeps what the state cannot hold, found again exactly.
#
# ## Exercises
#
# ### Exercise 7.1 — routing with an ablated expert (★★☆, about 8 min)
# `AblateExpert` changes one thing before top-k. Write the router's choice with some experts knocked out.

# %% tags=["exercise"]
@exercise("ablated_route")
def my_ablated_route(scores, bias, top_k, ablated):
    """scores [T, E], bias [E], top_k, ablated: list of ids -> (expert_ids [T, k], weights [T, k])."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_ablated_route, my_ablated_route)

# %% [markdown]
# ### Exercise 7.2 — how far did the prediction move? (★☆☆, about 5 min)
# `WhatIf.kl` compares the original next-token distribution with the branch's. Compute it from two
# rows of logits.

# %% tags=["exercise"]
@exercise("kl")
def my_kl(p_logits, q_logits):
    """p_logits, q_logits [V] -> KL(softmax(p) || softmax(q)) in nats (a float)."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_kl, my_kl)

# %% [markdown]
# ### Exercise 7.3 — wipe one KDA head (★★☆, about 8 min)
# `ResetState(layer, head)` clears everything that head remembers — without touching the timeline's copy.

# %% tags=["exercise"]
@exercise("reset_head")
def my_reset_head(state, conv, head, num_heads, head_dim):
    """state [B, H, K, V], conv [B, W-1, 3*H*K] -> a new (state, conv) with `head` wiped."""
    # YOUR CODE HERE
    raise NotImplementedError


try_exercise(check_reset_head, my_reset_head)

# %% [markdown]
# **Take-away.** Break one mechanism at a time and the model tells you what it was for: the selection
# bias spreads the load and, since it decides who runs, moves the loss too; the rest of the network was
# trained around its depth weights and breaks without them (co-adaptation: AttnRes's own worth takes two
# trainings to measure); a single expert of 896 hardly matters; and where this hybrid keeps its memory is
# printed in section 1 (its KDA states or its MLA caches), measured, not assumed.
# In the TUI, press `x` on a panel to ask the same questions of the frame you are looking at.
