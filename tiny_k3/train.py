"""Train a tiny K3 on the synthetic corpus; this is what makes the shipped checkpoints.

    python -m tiny_k3.train --preset small --curriculum scaffold-first --scaffold 200,100 --bind-from 2 --fresh-heads 0 --hidden-share 0.75,0.5,0.25 --forget-share 0.5 --steps 1500 --seed 0 --threads 1 --lr 3e-3 --eval-every 50 --compile --out tiny_k3/weights
    python -m tiny_k3.train --preset small-twin --curriculum scaffold-first --scaffold 200,100 --bind-from 2 --fresh-heads 0 --hidden-share 0.75,0.5,0.25 --forget-share 0.5 --steps 1500 --seed 0 --threads 1 --lr 3e-3 --eval-every 50 --compile --out tiny_k3/weights
    python -m tiny_k3.train --preset small-kda --curriculum scaffold-first --scaffold 200,100 --bind-from 2 --fresh-heads 0 --hidden-share 0.75,0.5,0.25 --forget-share 0.5 --steps 1500 --seed 0 --threads 1 --lr 3e-3 --eval-every 50 --compile --out tiny_k3/weights

(the commands of the shipped checkpoints: one recipe, the same corpus, seed, stages, optimiser and init, one thread
each, on the compiled path; logs and CPU times in bench/results/recipe52/). `<preset>-twin` is the all-softmax twin
of a preset, with KDA's short convolution kept in front of its attention (K3Config.twin, docs/recall.md);
--residual, --set and --no-bias-update make ablations. The recipe (SCAFFOLD_FIRST) starts with two memoryless
stages in which the hybrid's first MLA layer grows the look-up on a scaffold that comes down (tiny_k3/scaffold.py).
The twin and `small-kda` have nothing to scaffold, and neither is memoryless (the twin has no state; `small-kda`
keeps its states, memory_kept_without_mla): for both those are two answers-alone stages. From the third stage on
(--bind-from 2, recipes.binding_from) the hybrid's states learn the few pairs beside the MLA's look-up: head 0 of
layer 0's KDA mixer starts afresh (head 1 hands the previous bytes up to the MLA), three steps in four of that
stage, one in two of the next and one in four of the two whole-corpus stages read few-pair lines with the
definitions hidden from the MLA (Stage.hidden_share),
and the other steps wipe the states at half the recall marks (Stage.forget_share). The twin and `small-kda` read
the same rows; with one layer kind there is nothing to hide, re-initialise or wipe.

The data (tiny_k3.data) follow a curriculum of stages of equal length (CURRICULUM's four: recall lines alone,
first with every byte in the loss, then with the answers alone and every key asked; then the whole corpus with up
to 52 pairs (keys a-z, A-Z) and up to 128, then 200 characters of filler, in rows of 576 bytes that hold a 52-pair
line whole). The bytes a line determines (recalled values, sums' results) weigh 10x in the loss.
Every MLA layer's attention logits start x4 (QK_GAIN, scale_attention_logits_at_init). The log reports exact recall
at 4 pairs and 64 characters of filler, and at 16 and at 52 pairs with 16 (tiny_k3.recall).

One step: a batch of line-aligned windows (BOS + up to seq_len bytes), weighted next-byte cross-entropy, AdamW with
warm-up and cosine decay, gradient clipping, then the aux-loss-free selection-bias update of every MoE router
(DeepSeek-V3 §2.1.2, k3_facts.md §3b): b += gamma * sign(mean load - load), with the load of that very batch.
The bias is a buffer, so the optimiser never sees it; it only decides which experts win.

Checkpoints store matrices in bfloat16 and vectors (norms, depth queries, gates, router biases) in float32:
the vectors are a few kB and the router bias must keep steps of gamma = 1e-3 that bfloat16 would round away.
The held-out loss in the JSON beside a checkpoint is measured on the weights exactly as stored.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn import functional as F

from . import compiled
from .config import ConfigError, K3Config
from .data import BLIND_WINDOW, CurriculumData, Rows, Stage, StepRows, corpus_rows, definition_marks, step_drawn
from .fused import keep_freed_memory
from .hooks import Hooks
from .kda import KDALayer
from .model import TinyK3, fresh_init
from .recall import edited_recall_accuracy, hide_definitions_from_mla, make_probes, recall_accuracy
from .recipes import (ANSWER_WEIGHT, QK_GAIN, ANSWERS_FIRST, CURRICULA, CURRICULUM, CURRICULUM_26, CURRICULUM_FORGET,  # noqa: F401 (re-exported)
                      INDUCTION_CURRICULUM, LOOKUP_FIRST, SCAFFOLD_BLIND, SCAFFOLD_BLIND_FIRST, SCAFFOLD_FIRST,
                      with_mla_blind)
from .scaffold import Scaffold, parse_scaffold, scaffolded_config
from .train_args import build_parser as _parser, config_changes, curriculum_of  # noqa: F401 (re-exported)
from .weights import config_for, save_pretrained, stored_config, stored_state, weights_path

EVAL_SEED = 999_983           # the held-out text; a training seed may not equal it
EVAL_SEQUENCES = 32


def scale_attention_logits_at_init(model: TinyK3, gain: float) -> None:
    """Multiply every MLA layer's query and key projections by sqrt(gain): its attention logits by `gain`.

    Why: at width 64 with latents of 16 and 24 q.k dimensions the logits start near 0.1 (uniform attention),
    and the gradient that would sharpen a look-up is proportional to how much the logits already vary.
    Only the query projection and the key rows of kv_b (and the shared rope key) change; values do not.
    """
    if gain == 1.0:
        return
    root = gain ** 0.5
    c = model.config
    with torch.no_grad():
        for layer in (block.attn for block in model.blocks if block.kind == "mla"):
            (layer.q_b_proj if layer.q_b_proj is not None else layer.q_proj).weight.mul_(root)
            kv_b = layer.kv_b_proj.weight.view(c.mla_heads, c.qk_nope_dim + c.v_head_dim, -1)
            kv_b[:, :c.qk_nope_dim].mul_(root)
            layer.kv_a_proj.weight[c.kv_lora_rank:].mul_(root)


def lm_loss(model: TinyK3, rows: Rows, mla_window: int | None = None, hide_definitions: bool = False) -> torch.Tensor:
    """Weighted mean next-token cross-entropy of rows [B, T + 1] (weights 1 everywhere: plain nats/byte).
    Where rows.forget marks tokens, every KDA layer forgets its state before them (Stage.forget_share);
    `mla_window` limits every MLA layer to its last keys (Stage.mla_blind_share); `hide_definitions` hides every
    recall line's definitions from the MLA layers (Stage.hidden_share, data.definition_marks)."""
    forget = rows.forget[:, :-1] if rows.forget is not None and rows.forget.any() else None
    hidden = definition_marks(rows.tokens[:, :-1]) if hide_definitions else None
    hooks = (None if forget is None and mla_window is None and hidden is None
             else Hooks(forget_before=forget, attention_window=mla_window, mla_hidden_keys=hidden))
    logits, _ = model(rows.tokens[:, :-1], hooks=hooks)
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), rows.tokens[:, 1:].reshape(-1), reduction="none")
    w = rows.weights[:, 1:].reshape(-1)
    return (ce * w).sum() / w.sum().clamp_min(1e-12)     # (a short row of the answers-alone stage may hold none: 0)


@torch.no_grad()
def evaluate(model: TinyK3, rows: Rows, batch: int = 8) -> float:
    """Held-out loss (nats per byte, unweighted) over rows [N, T + 1]."""
    was_training = model.training
    model.eval()
    plain = lambda r: Rows(r.tokens, torch.ones_like(r.weights))  # noqa: E731
    losses = [lm_loss(model, plain(rows[i:i + batch])).item() * len(rows[i:i + batch])
              for i in range(0, len(rows), batch)]
    model.train(was_training)
    return sum(losses) / len(rows)


def heldout_rows(seq_len: int, device=None) -> Rows:
    return corpus_rows(EVAL_SEQUENCES, seq_len, EVAL_SEED).to(device)


def shipped_state(model: TinyK3) -> dict[str, torch.Tensor]:
    """The state dict exactly as a shipped checkpoint stores it (weights.stored_state, bfloat16 matrices)."""
    return stored_state(model, torch.bfloat16)


def save_checkpoint(model: TinyK3, path: str | Path, info: dict) -> Path:
    """Write `path` (safetensors: bfloat16 matrices, float32 vectors) and `info` as JSON beside it."""
    return save_pretrained(model, path, info, dtype=torch.bfloat16)


def load_checkpoint(path: str | Path, device=None) -> TinyK3:
    """Any checkpoint written by this module, built from the config in its metadata (ablations in runs/ have
    configs no preset names; shipped ones load through TinyK3.from_pretrained, which checks them against one)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as f:
        config = stored_config(f.metadata() or {})
    if config is None:
        raise ValueError(f"{path} holds no tiny-k3 config in its metadata.")
    model = TinyK3(config, device=device)
    model.load_state_dict(load_file(str(path)))
    return model


@dataclass
class TrainResult:
    model: TinyK3
    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)      # per step
    eval_steps: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    eval_recall: list[float] = field(default_factory=list)     # exact recall, 4 pairs, 64 tokens of filler
    eval_recall_many: list[float] = field(default_factory=list)  # exact recall, 16 pairs, 16 tokens of filler
    eval_recall_52: list[float] = field(default_factory=list)    # exact recall, 52 pairs, 16 tokens of filler
    # exact recall at 2 pairs (16 filler) with the definitions hidden from the MLA (recall.hide_definitions_from_mla):
    # what the KDA states carry alone; logged only in a run with hidden steps (Stage.hidden_share)
    eval_recall_2_mla_blind: list[float] = field(default_factory=list)
    fresh_eval_loss: float = float("nan")
    tokens: int = 0
    seconds: float = 0.0        # wall time of the training steps
    cpu_seconds: float = 0.0    # CPU time of this process: the cost on idle cores, however busy they were


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to lr / 10."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(config: K3Config, steps: int, seed: int = 0, *, batch: int | None = None, seq_len: int | None = None,
          lr: float = 2e-3,
          weight_decay: float = 0.1, clip: float = 1.0, warmup: int | None = None, bias_update: bool = True,
          answer_weight: float = ANSWER_WEIGHT, curriculum: tuple[Stage, ...] = CURRICULUM,
          qk_gain: float = 1.0, scaffold: Scaffold | None = None, eval_every: int = 250, device=None,
          progress: bool = True, log=print) -> TrainResult:
    """Train TinyK3(config) from seed for `steps` steps.

    The rows follow `curriculum` (data.Stage: the recall lines, the row length and batch of each stage) and
    weight the answer bytes by `answer_weight` in the loss (data.py); `batch` / `seq_len`, when given,
    replace every stage's (smoke runs, ablations). qk_gain scales the MLA attention logits at init
    (scale_attention_logits_at_init; 1 leaves the init as it is). `scaffold` grows the first MLA layer's look-up
    on a scaffold that comes down (tiny_k3.scaffold); the model returned is then TinyK3(config) exactly.
    """
    curriculum = _checked_curriculum(config, steps, seed, curriculum, batch, seq_len)
    if scaffold is not None and steps < scaffold.down_at + 1:
        raise ValueError(f"a run with --scaffold {scaffold.grow},{scaffold.fade} needs at least "
                         f"{scaffold.down_at + 1} steps, got {steps}.")
    torch.manual_seed(seed)
    model = TinyK3(config if scaffold is None else scaffolded_config(config), device=device)
    scale_attention_logits_at_init(model, qk_gain)
    if scaffold is not None:
        scaffold.put_up(model, config)
    data = CurriculumData(steps, seed, curriculum, answer_weight).map(
        lambda stage, rows: memory_kept_without_mla(config, rows).to(model.device))
    heldout = heldout_rows(max(st.seq_len for st in curriculum), model.device)
    probes = (make_probes(24, pairs=4, filler_chars=64, seed=EVAL_SEED),
              make_probes(8, pairs=16, filler_chars=16, seed=EVAL_SEED),
              [p for p in make_probes(4, pairs=52, filler_chars=16, seed=EVAL_SEED)
               if len(p.tokens) <= config.max_seq_len],      # (none for a preset too short for 52 pairs: "tiny")
              make_probes(24, pairs=2, filler_chars=16, seed=EVAL_SEED)
              if any(st.hidden_share for st in curriculum) and config.mla_layers and config.kda_layers else None)
    warmup = min(100, steps // 10) if warmup is None else warmup
    opt = adamw(model, lr, weight_decay)
    result = TrainResult(model, fresh_eval_loss=evaluate(model, heldout))
    log(f"{config.name}: {sum(p.numel() for p in model.parameters()):,} parameters, {steps} steps of "
        f"{' then '.join(f'{st.batch}x{st.seq_len}' for st in curriculum)} tokens, held-out loss at init "
        f"{result.fresh_eval_loss:.3f}")
    bar = _progress_bar(progress)
    start, cpu_start = time.perf_counter(), time.process_time()
    with bar:
        task = bar.add_task(f"train {config.name}", total=steps, loss=float("nan"), tps=0.0)
        for step in range(steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps, lr, warmup)
            if scaffold is not None:
                scaffold.before_step(model, config, step, log)
            at = data.at(step)
            loss = _curriculum_step(model, opt, config, curriculum, at, seed, step, clip, bias_update, log)
            result.steps.append(step + 1)
            result.train_loss.append(loss)
            result.tokens += at.rows.tokens[:, 1:].numel()
            result.seconds = time.perf_counter() - start
            result.cpu_seconds = time.process_time() - cpu_start
            bar.update(task, advance=1, loss=loss, tps=result.tokens / result.seconds)
            if (step + 1) % eval_every == 0 or step + 1 == steps:
                _evaluate_into(result, heldout, probes, f"step {step + 1}/{steps}", log)
    if scaffold is not None:
        result.model = scaffold.take_down(model, config)
    return result


def _curriculum_step(model: TinyK3, opt: torch.optim.Optimizer, config: K3Config, curriculum: tuple[Stage, ...],
                     at: StepRows, seed: int, step: int, clip: float, bias_update: bool, log) -> float:
    """One step of `train` on the rows `at` names: a fresh mixer where its stage begins with one (a hybrid only),
    then train_step, blind or hidden where the stage asks. Returns the loss."""
    stage, both_kinds = curriculum[at.stage], bool(config.mla_layers and config.kda_layers)
    if at.first and stage.fresh_kda_mixers and both_kinds:
        refresh_kda_mixers(model, stage.fresh_kda_mixers, seed + 1, opt, stage.fresh_kda_heads)
        log(f"step {step}: KDA layers {list(stage.fresh_kda_mixers)}' sequence mixers re-initialised"
            + (f" (heads {list(stage.fresh_kda_heads)})" if stage.fresh_kda_heads else ""))
    return train_step(model, opt, at.rows, clip, bias_update, step, blind_window(config, stage, seed, step),
                      at.hidden and both_kinds)


def memory_kept_without_mla(config: K3Config, rows: Rows) -> Rows:
    """`rows` without their forget marks where `config` has no MLA layer.

    A memoryless stage wipes every KDA state before every token, and a forget share at some recall marks, so that
    the MLA layers must look back (Stage.memoryless, Stage.forget_share); a model with no MLA layer (`small-kda`)
    would be left with nothing to look back with, so it keeps its states there and the stage is an ordinary one
    for it."""
    if rows.forget is not None and not config.mla_layers:
        return Rows(rows.tokens, rows.weights)
    return rows


def blind_window(config: K3Config, stage: Stage, seed: int, step: int) -> int | None:
    """BLIND_WINDOW on the steps that Stage.mla_blind_share blinds (drawn from seed and step), else None.
    Only a model with both MLA and KDA layers is ever blinded: another has nothing to fall back on."""
    if not (config.mla_layers and config.kda_layers):
        return None
    return BLIND_WINDOW if step_drawn(seed, step, stage.mla_blind_share) else None


def _checked_curriculum(config: K3Config, steps: int, seed: int, curriculum: tuple[Stage, ...], batch: int | None,
                        seq_len: int | None) -> tuple[Stage, ...]:
    """`curriculum` with `batch` / `seq_len` (where given) in every stage, after checking the run's arguments."""
    curriculum = tuple(dataclasses.replace(st, batch=batch or st.batch, seq_len=seq_len or st.seq_len)
                       for st in curriculum)
    batch, seq_len = min(st.batch for st in curriculum), max(st.seq_len for st in curriculum)
    if steps < len(curriculum) or batch < 1 or min(st.seq_len for st in curriculum) < 2:
        raise ValueError(f"steps must be at least the {len(curriculum)} stages, batch positive and seq_len at least 2, "
                         f"got {steps}, {batch}, {seq_len}.")
    if seed == EVAL_SEED:
        raise ValueError(f"seed {EVAL_SEED} is reserved for the held-out text; pick another seed.")
    if seq_len + 1 > config.max_seq_len:
        raise ValueError(f"seq_len {seq_len} (+ BOS) is longer than preset {config.name!r} allows "
                         f"({config.max_seq_len}).")
    return curriculum


def adamw(model: TinyK3, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW (betas 0.9, 0.95) with weight decay on the matrices only, not on vectors (norms, biases, gates).

    On the compiled path (tiny_k3/compiled.py) torch's fused AdamW: the same update in one kernel for all
    parameters instead of about ten small ops for each (small: 2.9 ms a step against 14)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95),
                            fused=compiled.enabled() or None)
    if opt.defaults["fused"]:
        opt.register_step_post_hook(lambda optimizer, args, kwargs: mark_updated(optimizer))
    return opt


def refresh_kda_mixers(model: TinyK3, layers: tuple[int, ...], seed: int, opt: torch.optim.Optimizer,
                       heads: tuple[int, ...] = ()) -> None:
    """Re-initialise these KDA layers' sequence mixers as a fresh model's (torch seed `seed` + layer), clearing
    their optimiser moments (Stage.fresh_kda_mixers); with `heads`, only those heads' parts (Stage.fresh_kda_heads).
    The layers' norms, MLPs and depth queries stay."""
    config = model.config
    bad = [h for h in heads if not 0 <= h < config.kda_heads]
    if bad:
        raise ValueError(f"fresh_kda_heads names heads {bad}; a KDA layer here has heads 0 to {config.kda_heads - 1}.")
    for index in layers:
        if config.layer_kinds[index] != "kda":
            raise ValueError(f"fresh_kda_mixers names layer {index}, a {config.layer_kinds[index]} layer; "
                             f"the KDA layers are {config.kda_layers}.")
        mixer = model.blocks[index].attn
        weight = next(mixer.parameters())
        torch.manual_seed(seed + index)
        fresh = dict(fresh_init(KDALayer(config, device=weight.device, dtype=weight.dtype), config).named_parameters())
        with torch.no_grad():
            for name, p in mixer.named_parameters():
                part = _head_part(name, p, config, heads)
                if part is not None:
                    p[part] = fresh[name][part]
                    for moment in opt.state.get(p, {}).values():
                        if moment.shape == p.shape:            # (exp_avg, exp_avg_sq; not the step count)
                            moment[part] = 0.0


def _head_part(name: str, p: torch.Tensor, config: K3Config, heads: tuple[int, ...]):
    """The index of `heads`' share of KDA parameter `name` (all of it where heads is empty), or None where the
    heads share the parameter (the gate's low-rank input f_a, the output norm's gain)."""
    H, K = config.kda_heads, config.kda_head_dim            # (K = V in this model)
    if not heads:
        return (slice(None),)
    channels = torch.cat([torch.arange(h * K, (h + 1) * K) for h in heads])
    if name.startswith("o_proj"):                            # columns: the heads' outputs it reads
        return (slice(None), channels)
    if p.shape[0] == H * K:                                  # rows: each head's channels (q, k, v, convs, gates)
        return (channels,)
    if p.shape[0] == H:                                      # one row or value per head (A_log, beta's b_proj)
        return (torch.tensor(heads),)
    return None


def mark_updated(opt: torch.optim.Optimizer) -> None:
    """Count a fused optimiser's step as the in-place change it is (adamw hooks it after each fused step).

    torch's fused AdamW writes the parameters without bumping their version counters (torch 2.13), so a cache keyed
    on them (fused.CachedWeights: the concatenated projections a forward without autograd reads) would go on serving
    the weights of before the step: the held-out loss and recall logged during a compiled run read stale weights,
    far from the model's own."""
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                torch.autograd.graph.increment_version(p)


def train_step(model: TinyK3, opt: torch.optim.Optimizer, rows: Rows, clip: float, bias_update: bool,
               step: int, mla_window: int | None = None, hide_definitions: bool = False) -> float:
    """One step on `rows`: the weighted loss, its gradients clipped to norm `clip`, the optimiser step, then the
    selection-bias update of every MoE router from the load of this batch. Returns the loss.

    `hide_definitions` (a hidden step, Stage.hidden_share): the definitions are hidden from every MLA layer and
    the MLA layers' attention is frozen for the step, so the step teaches the rest to answer without it."""
    keep_freed_memory()     # (once a process) the step's temporaries reuse freed memory, not fresh pages: fused.py
    frozen = ([q for block in model.blocks if block.kind == "mla" for q in block.attn.parameters() if q.requires_grad]
              if hide_definitions else [])
    for q in frozen:
        q.requires_grad_(False)
    try:
        loss = lm_loss(model, rows, mla_window, hide_definitions)
    finally:
        for q in frozen:
            q.requires_grad_(True)
    if not torch.isfinite(loss):
        raise ValueError(f"the loss became {loss.item()} at step {step + 1}; try a smaller --lr.")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    if bias_update:
        for moe in model.moe_layers():
            moe.router.update_bias(moe.last_load)
    return loss.item()


def _progress_bar(progress: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[tps]:,.0f} tok/s"),
                    TimeRemainingColumn(), disable=not progress, transient=False)


def _evaluate_into(result: TrainResult, heldout: Rows, probes: tuple, label: str, log) -> None:
    """Append the held-out loss and both recall scores at this step to `result`, and log them."""
    model = result.model
    result.eval_steps.append(result.steps[-1])
    result.eval_loss.append(evaluate(model, heldout))
    result.eval_recall.append(recall_accuracy(model, probes[0]))
    result.eval_recall_many.append(recall_accuracy(model, probes[1]))
    result.eval_recall_52.append(recall_accuracy(model, probes[2]) if probes[2] else float("nan"))
    blind = ""
    if probes[3]:
        result.eval_recall_2_mla_blind.append(edited_recall_accuracy(model, probes[3], hide_definitions_from_mla))
        blind = f"  recall2 MLA-blind {result.eval_recall_2_mla_blind[-1]:.0%}"
    last = result.train_loss[-50:]
    log(f"{label}: train {sum(last) / len(last):.3f}"
        f"  held-out {result.eval_loss[-1]:.3f}  recall {result.eval_recall[-1]:.0%}"
        f"  recall16 {result.eval_recall_many[-1]:.0%}  recall52 {result.eval_recall_52[-1]:.0%}{blind}"
        f"  {result.tokens / result.seconds:,.0f} tok/s"
        f"  {result.seconds:.0f}s wall, {result.cpu_seconds:.0f}s CPU")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    try:
        from .model import resolve_device

        config = config_for(args.preset)
        suffix = ((f"-{args.residual}" if args.residual else "") + ("-nobias" if args.no_bias_update else "")
                  + ("-mlaconv" if args.mla_conv else ""))
        if args.residual:
            config = config.replace(residual=args.residual)
        if args.mla_conv:
            config = config.replace(mla_conv_layers=tuple(sorted({*config.mla_conv_layers, *config.mla_layers})))
        if args.set:
            config = config.replace(**config_changes(args.set))      # (K3Config validates itself)
            suffix += "-set"
        if suffix:
            config = config.replace(name=config.name + suffix)
        if args.threads:
            torch.set_num_threads(args.threads)
        if args.compile:
            compiled.enable()
        if compiled.enabled():
            print("compiled path on (tiny_k3/compiled.py): the first steps of each shape include compiling", flush=True)
        device = resolve_device(args.device)
        scaffold = None if args.scaffold is None else parse_scaffold(args.scaffold)
        from rich.console import Console
        console = Console()
        result = train(config, args.steps, args.seed, batch=args.batch, seq_len=args.seq_len, lr=args.lr,
                       warmup=args.warmup, curriculum=curriculum_of(args), qk_gain=args.qk_gain, scaffold=scaffold,
                       bias_update=not args.no_bias_update, answer_weight=args.answer_weight, eval_every=args.eval_every, device=device,
                       progress=console.is_terminal, log=lambda msg: print(msg, flush=True))
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model = result.model
    model.load_state_dict(shipped_state(model))      # measure the weights exactly as they will be stored
    eval_len = args.seq_len or curriculum_of(args)[-1].seq_len
    heldout = evaluate(model, heldout_rows(eval_len, model.device))
    info = _run_info(args, argv, config, result, heldout, eval_len, device)
    if compiled.enabled():
        print(f"compiled ops: {info['compiled']['seconds']:.1f} s of compiling, in the first steps' times", flush=True)
    path = save_checkpoint(model, weights_path(info["name"], Path(args.out)), info)
    print(f"saved {path} ({path.stat().st_size / 1e6:.2f} MB): final train loss {info['final_train_loss']}, "
          f"held-out {info['heldout_loss']} (fresh weights {info['heldout_loss_fresh']})")
    return 0


def _run_info(args: argparse.Namespace, argv: list[str], config: K3Config, result: TrainResult, heldout: float,
              eval_len: int, device) -> dict:
    """The JSON beside a checkpoint: the command, its arguments, the losses and the curve."""
    last = result.train_loss[-50:]
    return {
        "name": args.name or config.name, "preset": args.preset,
        "command": "python -m tiny_k3.train " + " ".join(shlex.quote(a) for a in argv),
        "seed": args.seed, "steps": args.steps, "batch": args.batch, "seq_len": args.seq_len, "lr": args.lr,
        "answer_weight": args.answer_weight, "warmup": args.warmup, "qk_gain": args.qk_gain,
        "scaffold": args.scaffold,
        "curriculum_name": args.curriculum,
        "curriculum": [dataclasses.asdict(stage) for stage in curriculum_of(args)],
        "bias_update": not args.no_bias_update, "residual": config.residual, "tokens": result.tokens,
        "final_train_loss": round(sum(last) / len(last), 4), "heldout_loss": round(heldout, 4),
        "heldout_loss_fresh": round(result.fresh_eval_loss, 4), "heldout": f"sample_corpus seed {EVAL_SEED}, "
        f"{EVAL_SEQUENCES} rows of {eval_len}", "wall_seconds": round(result.seconds, 1),
        "cpu_seconds": round(result.cpu_seconds, 1), "command_cpu_seconds": round(time.process_time(), 1),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "device": str(device),
        "stored_dtypes": "matrices bfloat16, vectors float32",
        "compiled": {"on": compiled.enabled(), "seconds": round(compiled.compile_seconds(), 1),
                     "eager_because": {name: op.failed for name, op in compiled.ops().items() if op.failed}},
        "curve": {"step": result.steps[9::10], "train_loss": [round(sum(result.train_loss[i - 10:i]) / 10, 4)
                                                             for i in result.steps[9::10]],
                  "eval_step": result.eval_steps, "eval_loss": [round(x, 4) for x in result.eval_loss],
                  "eval_recall_4pairs_64filler": [round(x, 4) for x in result.eval_recall],
                  "eval_recall_16pairs_16filler": [round(x, 4) for x in result.eval_recall_many],
                  "eval_recall_52pairs_16filler": [round(x, 4) for x in result.eval_recall_52],
                  "eval_recall_2pairs_16filler_mla_blind": [round(x, 4) for x in result.eval_recall_2_mla_blind]},
    }


if __name__ == "__main__":
    sys.exit(main())
