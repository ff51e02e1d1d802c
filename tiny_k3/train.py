"""Train a tiny K3 on the synthetic corpus; this is what makes the shipped checkpoints.

    python -m tiny_k3.train --preset small --steps 2000 --seed 0 --threads 1 --out tiny_k3/weights
    python -m tiny_k3.train --preset small-twin --steps 2000 --seed 0 --threads 1 --out tiny_k3/weights

(the commands of the shipped checkpoints; about 25 minutes of one core each, so both fit 30 minutes on 2 cores).
`<preset>-twin` is the all-softmax twin of a preset; --residual and --no-bias-update make ablations.

One step: a batch of line-aligned windows (BOS + up to seq_len bytes), next-byte cross-entropy, AdamW with
warm-up and cosine decay, gradient clipping, then the aux-loss-free selection-bias update of every MoE router
(DeepSeek-V3 §2.1.2, k3_facts.md §3b): b += gamma * sign(mean load - load), with the load of that very batch.
The bias is a buffer, so the optimiser never sees it; it only decides which experts win.

Checkpoints store matrices in bfloat16 and vectors (norms, depth queries, gates, router biases) in float32:
the vectors are a few kB and the router bias must keep steps of gamma = 1e-3 that bfloat16 would round away.
The held-out loss in the JSON beside a checkpoint is measured on the weights exactly as stored.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn import functional as F

from .config import ConfigError, K3Config
from .corpus import sample_corpus
from .model import TinyK3
from .tokenizer import BOS
from .weights import config_for, save_pretrained, weights_path

EVAL_SEED = 999_983           # the held-out text; a training seed may not equal it
EVAL_SEQUENCES = 32


def pack_lines(text: str, seq_len: int) -> torch.Tensor:
    """Text -> [N, seq_len + 1] long: each row is BOS + seq_len bytes that start at the start of a line.

    A row that cuts a line is followed by a row starting at that line's start (lines shorter than seq_len
    are always seen whole); only the tail that cannot fill a row is dropped.
    """
    data = torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()
    starts = torch.cat([torch.zeros(1, dtype=torch.long), (data == 10).nonzero().flatten() + 1])
    rows, start = [], 0
    while start + seq_len <= len(data):
        end = start + seq_len
        rows.append(torch.cat([torch.tensor([BOS]), data[start:end]]))
        cut = starts[(starts > start) & (starts <= end)]       # line starts inside this row
        start = int(cut[-1]) if len(cut) else end
    if not rows:
        raise ValueError(f"text of {len(data)} bytes is shorter than one row of seq_len={seq_len}.")
    return torch.stack(rows)


def corpus_rows(n_rows: int, seq_len: int, seed: int) -> torch.Tensor:
    """At least n_rows packed rows of sample_corpus(seed) -> [n_rows, seq_len + 1]."""
    n_chars = int(n_rows * seq_len * 1.3) + 4 * seq_len
    while True:
        rows = pack_lines(sample_corpus(n_chars, seed), seq_len)
        if len(rows) >= n_rows:
            return rows[:n_rows]
        n_chars *= 2


def lm_loss(model: TinyK3, rows: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of rows [B, T + 1]."""
    logits, _ = model(rows[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model: TinyK3, rows: torch.Tensor, batch: int = 8) -> float:
    """Held-out loss (nats per byte) over rows [N, T + 1]."""
    was_training = model.training
    model.eval()
    losses = [lm_loss(model, rows[i:i + batch]).item() * len(rows[i:i + batch]) for i in range(0, len(rows), batch)]
    model.train(was_training)
    return sum(losses) / len(rows)


def heldout_rows(seq_len: int, device=None) -> torch.Tensor:
    return corpus_rows(EVAL_SEQUENCES, seq_len, EVAL_SEED).to(device)


def shipped_state(model: TinyK3) -> dict[str, torch.Tensor]:
    """The state dict as stored: matrices in bfloat16, vectors (and anything not floating) as they are."""
    def store(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().cpu()
        if not t.is_floating_point():
            return t
        return t.to(torch.bfloat16) if t.dim() >= 2 else t.float()
    return {name: store(t) for name, t in model.state_dict().items()}


class _Stored:
    """What save_pretrained needs (.config, .state_dict()), holding the state dict in its stored dtypes.
    (save_pretrained's own dtype= keeps only the router biases in float32; the shipped files keep every vector.)"""

    def __init__(self, model: TinyK3):
        self.config, self._state = model.config, shipped_state(model)

    def state_dict(self):
        return self._state


def save_checkpoint(model: TinyK3, path: str | Path, info: dict) -> Path:
    """Write `path` (safetensors, via weights.save_pretrained) and `info` as JSON beside it."""
    return save_pretrained(_Stored(model), path, info)


def load_checkpoint(path: str | Path, device=None) -> TinyK3:
    """Any checkpoint written by this module, built from the config in its metadata (ablations in runs/ have
    configs no preset names; shipped ones load through TinyK3.from_pretrained, which checks them against one)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as f:
        config = K3Config(**json.loads(f.metadata()["config"]))
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


def train(config: K3Config, steps: int, seed: int = 0, *, batch: int = 8, seq_len: int = 256, lr: float = 3e-3,
          weight_decay: float = 0.1, clip: float = 1.0, warmup: int | None = None, bias_update: bool = True,
          eval_every: int = 250, device=None, progress: bool = True, log=print) -> TrainResult:
    """Train TinyK3(config) from seed for `steps` steps of `batch` rows of seq_len tokens."""
    if steps < 1 or batch < 1 or seq_len < 2:
        raise ValueError(f"steps and batch must be positive and seq_len at least 2, got {steps}, {batch}, {seq_len}.")
    if seed == EVAL_SEED:
        raise ValueError(f"seed {EVAL_SEED} is reserved for the held-out text; pick another seed.")
    if seq_len + 1 > config.max_seq_len:
        raise ValueError(f"seq_len {seq_len} (+ BOS) is longer than preset {config.name!r} allows "
                         f"({config.max_seq_len}).")
    torch.manual_seed(seed)
    model = TinyK3(config, device=device)
    data = corpus_rows(steps * batch, seq_len, seed).to(model.device)
    heldout = heldout_rows(seq_len, model.device)
    warmup = min(100, steps // 10) if warmup is None else warmup
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    result = TrainResult(model, fresh_eval_loss=evaluate(model, heldout))
    log(f"{config.name}: {sum(p.numel() for p in model.parameters()):,} parameters, {steps} steps of "
        f"{batch}x{seq_len} tokens, held-out loss at init {result.fresh_eval_loss:.3f}")

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[tps]:,.0f} tok/s"),
                   TimeRemainingColumn(), disable=not progress, transient=False)
    start, cpu_start = time.perf_counter(), time.process_time()
    with bar:
        task = bar.add_task(f"train {config.name}", total=steps, loss=float("nan"), tps=0.0)
        for step in range(steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps, lr, warmup)
            loss = lm_loss(model, data[step * batch:(step + 1) * batch])
            if not torch.isfinite(loss):
                raise ValueError(f"the loss became {loss.item()} at step {step + 1}; try a smaller --lr.")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            if bias_update:
                for moe in model.moe_layers():
                    moe.router.update_bias(moe.last_load)
            result.steps.append(step + 1)
            result.train_loss.append(loss.item())
            result.tokens += batch * seq_len
            result.seconds = time.perf_counter() - start
            result.cpu_seconds = time.process_time() - cpu_start
            bar.update(task, advance=1, loss=loss.item(), tps=result.tokens / result.seconds)
            if (step + 1) % eval_every == 0 or step + 1 == steps:
                result.eval_steps.append(step + 1)
                result.eval_loss.append(evaluate(model, heldout))
                log(f"step {step + 1}/{steps}: train {sum(result.train_loss[-50:]) / len(result.train_loss[-50:]):.3f}"
                    f"  held-out {result.eval_loss[-1]:.3f}  {result.tokens / result.seconds:,.0f} tok/s"
                    f"  {result.seconds:.0f}s wall, {result.cpu_seconds:.0f}s CPU")
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m tiny_k3.train", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small", help="a preset name, or <preset>-twin for its all-softmax twin")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs", help="directory for <name>.safetensors and <name>.json")
    parser.add_argument("--name", default=None, help="file name (default: the config name)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--residual", choices=("block", "full", "standard"), default=None,
                        help="override the preset's residual (an ablation, not a shipped preset)")
    parser.add_argument("--no-bias-update", action="store_true", help="ablation: never move the router bias")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    try:
        from .model import resolve_device

        config = config_for(args.preset)
        suffix = (f"-{args.residual}" if args.residual else "") + ("-nobias" if args.no_bias_update else "")
        if args.residual:
            config = config.replace(residual=args.residual)
        if suffix:
            config = config.replace(name=config.name + suffix)
        if args.threads:
            torch.set_num_threads(args.threads)
        device = resolve_device(args.device)
        from rich.console import Console
        console = Console()
        result = train(config, args.steps, args.seed, batch=args.batch, seq_len=args.seq_len, lr=args.lr,
                       bias_update=not args.no_bias_update, eval_every=args.eval_every, device=device,
                       progress=console.is_terminal, log=lambda msg: print(msg, flush=True))
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model = result.model
    model.load_state_dict(shipped_state(model))      # measure the weights exactly as they will be stored
    heldout = evaluate(model, heldout_rows(args.seq_len, model.device))
    last = result.train_loss[-50:]
    info = {
        "name": args.name or config.name, "preset": args.preset,
        "command": "python -m tiny_k3.train " + " ".join(shlex.quote(a) for a in argv),
        "seed": args.seed, "steps": args.steps, "batch": args.batch, "seq_len": args.seq_len, "lr": args.lr,
        "bias_update": not args.no_bias_update, "residual": config.residual, "tokens": result.tokens,
        "final_train_loss": round(sum(last) / len(last), 4), "heldout_loss": round(heldout, 4),
        "heldout_loss_fresh": round(result.fresh_eval_loss, 4), "heldout": f"sample_corpus seed {EVAL_SEED}, "
        f"{EVAL_SEQUENCES} rows of {args.seq_len}", "wall_seconds": round(result.seconds, 1),
        "cpu_seconds": round(result.cpu_seconds, 1), "command_cpu_seconds": round(time.process_time(), 1),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "device": str(device),
        "stored_dtypes": "matrices bfloat16, vectors float32",
        "curve": {"step": result.steps[9::10], "train_loss": [round(sum(result.train_loss[i - 10:i]) / 10, 4)
                                                             for i in result.steps[9::10]],
                  "eval_step": result.eval_steps, "eval_loss": [round(x, 4) for x in result.eval_loss]},
    }
    path = save_checkpoint(model, weights_path(info["name"], Path(args.out)), info)
    print(f"saved {path} ({path.stat().st_size / 1e6:.2f} MB): final train loss {info['final_train_loss']}, "
          f"held-out {info['heldout_loss']} (fresh weights {info['heldout_loss_fresh']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
