"""`python -m sim real DIR`: a checkpoint in the released K3 format, streamed from disk layer by layer.

DIR holds what the release holds: config.json, model.safetensors.index.json and the shards it names. The
shards are memory-mapped (safetensors' safe_open); per token, each layer's attention, router, shared experts,
latent projections, norms and depth queries are read and turned into the same tiny_k3 modules TinyK3 runs
(tiny_k3.model.Block), and in each MoE layer only the k chosen experts' MXFP4 blocks are read and decoded
(tiny_k3.mxfp4). The token's Frame is recorded exactly as the simulator records one (`RealSimulation` is a
sim.Simulation whose model is the stream), so routing, KDA state, depth weights and memory read the same.

Nothing is downloaded unless --download asks (sim/real_download.py): a missing file is an error naming it.
Tokens are the checkpoint's own BPE where its tiktoken.model and tokenizer_config.json are there
(tiny_k3.tokenizer.CheckpointTokenizer, --tokenizer auto), else bytes. --layers N streams a truncated model.
--synthetic first writes a tiny synthetic release into an empty or missing DIR (sim/real_synthetic.py), to
try the format without the real checkpoint's 1.56 TB.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from tiny_k3.attnres import DepthAttention, DepthStream
from tiny_k3.cache import ModelCache
from tiny_k3.config import K3Config
from tiny_k3.model import Block, resolve_device
from tiny_k3.moe import LatentMoE
from tiny_k3.mxfp4 import decode
from tiny_k3.norm import RMSNorm
from tiny_k3.probe import NO_RECORDER, Recorder, detached
from tiny_k3.released import (EXPERT, LM, NOT_LANGUAGE, ST_DTYPES, ReleasedFormatError, Spec, Target, layer_of,
                              released_tensors, target_of)
from tiny_k3.tokenizer import BYTES, TOKENIZER_FILES, CheckpointTokenizer

from .real_needs import check_ram, check_save_disk, layer_bytes  # noqa: F401  (layer_bytes: sim.real's public name)
from .runfile import RELEASED
from .session import Simulation

INDEX = "model.safetensors.index.json"


class Checkpoint:
    """A released-format folder: its config, its index and memory-mapped shards, and a count of the bytes read.

    Everything is checked before the first token: config.json and the index exist, every shard the index names
    for the tensors this run reads exists, every language-model tensor of the layout is in the index, and (on
    first read) each tensor's shape and dtype in its shard header match the layout. `reads` logs (token, name,
    bytes) of every read.

    layers: stream only the first `layers` layers, then the head (a truncated model: its tokens are not the
    checkpoint's; the count must end on an MLA layer, as K3's schedule does)."""

    def __init__(self, folder, compute_dtype: torch.dtype = torch.float32, layers: int | None = None):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ReleasedFormatError(f"{self.folder} is not a folder; give the folder that holds config.json, "
                                      f"{INDEX} and the shards.")
        self.full_config = K3Config.from_released(self.folder / "config.json")
        self.config = truncated(self.full_config, layers)
        index = self.folder / INDEX
        if not index.is_file():
            raise ReleasedFormatError(f"{index} is missing; a released checkpoint folder holds config.json, {INDEX} "
                                      f"and the shards it names (nothing is downloaded without --download).")
        self.weight_map = read_weight_map(index)
        self.specs: dict[str, Spec] = released_tensors(self.config)
        absent = [n for n in self.specs if n not in self.weight_map]
        if absent:
            raise ReleasedFormatError(f"{INDEX} lacks {len(absent)} tensors of the released layout, "
                                      f"e.g. {absent[0]!r}.")
        shards = sorted({self.weight_map[n] for n in self.specs})
        missing = [s for s in shards if not (self.folder / s).is_file()]
        if missing:
            raise ReleasedFormatError(f"{len(missing)} of the {len(shards)} shards this run reads (named in {INDEX}) "
                                      f"are missing from {self.folder}, e.g. {missing[0]} (nothing is downloaded "
                                      f"without --download).")
        extra = [n for n in self.weight_map if n not in self.specs and not n.startswith(NOT_LANGUAGE)
                 and layer_of(n) < self.config.num_layers]
        if extra:
            target_of(extra[0])          # names the unknown tensor
        self.compute_dtype = compute_dtype
        self._open: dict[str, object] = {}
        self._checked: set[str] = set()
        self.token = 0                     # the token being computed (for `reads`)
        self.reads: list[tuple[int, str, int]] = []

    @property
    def is_truncated(self) -> bool:
        return self.config.num_layers < self.full_config.num_layers

    def _file(self, name: str):
        shard = self.weight_map[name]
        if shard not in self._open:
            self._open[shard] = safe_open(str(self.folder / shard), framework="pt")   # memory-mapped
        return self._open[shard]

    def _check(self, name: str, f) -> None:
        if name in self._checked:
            return
        spec = self.specs[name]
        piece = f.get_slice(name)
        shape, dtype = tuple(piece.get_shape()), piece.get_dtype()
        if shape != spec.shape:
            raise ReleasedFormatError(f"{name} has shape {list(shape)} in {self.weight_map[name]}; the layout of "
                                      f"this config.json needs {list(spec.shape)}.")
        if (spec.dtype == "U8") != (dtype == "U8") or dtype not in ST_DTYPES:
            raise ReleasedFormatError(f"{name} is {dtype} in {self.weight_map[name]}; the layout needs {spec.dtype}.")
        self._checked.add(name)

    def read(self, name: str, rows: slice | None = None) -> torch.Tensor:
        """The tensor `name` (or rows of it), as stored; its bytes are added to `reads`."""
        f = self._file(name)
        self._check(name, f)
        t = f.get_tensor(name) if rows is None else f.get_slice(name)[rows]
        self.reads.append((self.token, name, t.numel() * t.element_size()))
        return t

    def bytes_read(self, token: int | None = None) -> int:
        return sum(b for t, _, b in self.reads if token is None or t == token)


def read_weight_map(index: Path) -> dict[str, str]:
    """The weight_map of a safetensors index json: tensor name -> shard file."""
    try:
        return json.loads(Path(index).read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReleasedFormatError(f"{index} is not a safetensors index with a weight_map ({exc}).") from None


def truncated(config: K3Config, layers: int | None) -> K3Config:
    """`config` cut to its first `layers` layers (None: all of it). The schedule must still end on an MLA layer,
    so the allowed counts are the MLA layers' positions + 1 (4, 8, ..., 88, 92, 93 for K3)."""
    if layers is None or layers == config.num_layers:
        return config
    allowed = [i + 1 for i in config.mla_layers]
    if layers not in allowed:
        shown = ", ".join(map(str, allowed if len(allowed) <= 6 else allowed[:2] + ["..."] + allowed[-2:]))
        raise ValueError(f"--layers {layers}: a truncated model keeps K3's schedule, which ends on an MLA layer; "
                         f"allowed: {shown}.")
    return config.replace(name=f"{config.name}-first-{layers}", num_layers=layers,
                          layer_kinds=config.layer_kinds[:layers])


def _convert(t: torch.Tensor, target: Target, config: K3Config, dtype: torch.dtype) -> torch.Tensor:
    """A released tensor as its tiny_k3 entry: a depth query's [1, D] row to [D], A_log's stored [head_dim]
    to its [kda_heads] values (the padding must be zeros), then the compute dtype (the selection bias: float32)."""
    if target.how == "row":
        t = t.reshape(-1)
    elif target.how == "pad":
        H = config.kda_heads
        if bool((t[H:] != 0).any()):
            raise ReleasedFormatError(f"A_log holds nonzero values past its {H} heads; its padding must be zeros.")
        t = t[:H]
    return t.to(torch.float32 if target.how == "buffer" else dtype)


class StreamedMoE(LatentMoE):
    """LatentMoE whose routed experts are read from the checkpoint per call: only the chosen ones.

    The router, latent projections, norm and shared experts are LatentMoE's own (loaded by the stream); the
    expert stacks hold just the experts this call chose, decoded from MXFP4, and the ids are remapped onto
    them. The sums are LatentMoE's general path (`route_tokens`, `mix_experts`, `combine`)."""

    def __init__(self, config: K3Config, checkpoint: Checkpoint, layer: int, device=None, dtype=None):
        super().__init__(config, device="meta", dtype=dtype)
        for name in ("w1", "w2", "w3"):
            del self._parameters[name]
        self.checkpoint, self.layer_index, self.run_device = checkpoint, layer, device

    def _experts(self, ids: torch.Tensor) -> None:
        dtype = self.checkpoint.compute_dtype
        stacks = {"w1": [], "w2": [], "w3": []}
        for e in ids.tolist():
            base = EXPERT.format(layer=self.layer_index, expert=e)
            for w, stack in stacks.items():
                packed = self.checkpoint.read(base + w + ".weight_packed")
                scale = self.checkpoint.read(base + w + ".weight_scale")
                stack.append(decode(packed, scale, dtype=dtype))
        for w, stack in stacks.items():
            object.__setattr__(self, w, torch.stack(stack).to(self.run_device))

    def forward(self, x: torch.Tensor, recorder: Recorder = NO_RECORDER, layer: int = 0, hooks=None) -> torch.Tensor:
        routing = self.route_tokens(x, recorder, layer, hooks)
        ids = routing.expert_ids.reshape(-1)
        chosen = torch.unique(ids)                                   # sorted: each expert read once per call
        self._experts(chosen)
        z = self.down(x).reshape(-1, self.config.latent_dim)
        y = self.mix_experts(z, torch.searchsorted(chosen, ids), routing.weights.reshape(-1).to(z.dtype))
        return self.combine(y.reshape(*x.shape[:-1], -1), x)


class StreamedK3(nn.Module):
    """TinyK3's forward with every layer's weights read from a Checkpoint as the layer runs (B = 1).

    keep: hold each layer's non-expert modules after their first read (RAM for speed; the experts are always
    read per token). progress(layer, layers, seconds) is called after each layer."""

    def __init__(self, checkpoint: Checkpoint, device=None, keep: bool = False, progress=None):
        super().__init__()
        self.checkpoint, self.config = checkpoint, checkpoint.config
        self.run_device = torch.device(device or "cpu")
        self.keep, self.progress = keep, progress
        self._kept: dict[int, nn.Module] = {}

    @property
    def device(self) -> torch.device:
        return self.run_device

    def _load(self, module: nn.Module, prefix: str, names: list[str]) -> nn.Module:
        """Materialise `module` (built on meta) on the run device and fill every entry of its state_dict from the
        released tensors `names`; an entry left unfilled is an error (nothing may start uninitialised)."""
        module.to_empty(device=self.run_device)
        state = module.state_dict(keep_vars=True)
        filled = set()
        for name in names:
            target = target_of(name)
            key = target.tiny[len(prefix):]
            value = _convert(self.checkpoint.read(name), target, self.config, self.checkpoint.compute_dtype)
            with torch.no_grad():
                state[key].copy_(value.to(self.run_device))
            filled.add(key)
        if filled != set(state):
            raise ReleasedFormatError(f"the released tensors leave {sorted(set(state) - filled)} unfilled.")
        return module.eval()

    def block(self, i: int) -> Block:
        if i in self._kept:
            return self._kept[i]
        cfg, dtype = self.config, self.checkpoint.compute_dtype
        block = Block(cfg, i, device="meta", dtype=dtype)
        if block.mlp_kind == "moe":
            block.mlp = StreamedMoE(cfg, self.checkpoint, i, device=self.run_device, dtype=dtype)
        prefix = LM + f"model.layers.{i}."
        names = [n for n in self.checkpoint.specs if n.startswith(prefix) and ".experts." not in n]
        self._load(block, f"blocks.{i}.", names)
        if self.keep:
            self._kept[i] = block
        return block

    def _head(self) -> tuple[DepthAttention, RMSNorm, nn.Linear]:
        cfg, dtype = self.config, self.checkpoint.compute_dtype
        head = nn.Module()
        head.out_res = DepthAttention(cfg.hidden_size, cfg.rms_norm_eps, device="meta", dtype=dtype)
        head.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device="meta", dtype=dtype)
        head.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device="meta", dtype=dtype)
        names = [LM + "model.output_attn_res_norm.weight", LM + "model.output_attn_res_proj.weight",
                 LM + "model.norm.weight", LM + "lm_head.weight"]
        self._load(head, "", names)
        return head.out_res, head.final_norm, head.lm_head

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, cache: ModelCache | None = None, recorder: Recorder | None = None,
                attention_mask=None, hooks=None) -> tuple[torch.Tensor, ModelCache]:
        cfg = self.config
        if attention_mask is not None or tokens.dim() != 2 or tokens.shape[0] != 1:
            raise ValueError("the streamed model takes one unpadded row of tokens, [1, T].")
        recorder = NO_RECORDER if recorder is None else recorder
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= cfg.vocab_size:
            raise ValueError(f"token ids must lie in [0, {cfg.vocab_size}), got {low}..{high}.")
        cache = cache if cache is not None else ModelCache(cfg.num_layers)
        self.checkpoint.token = cache.position
        rows = [self.checkpoint.read(LM + "model.embed_tokens.weight", slice(t, t + 1)) for t in tokens[0].tolist()]
        x = torch.cat(rows).to(self.run_device, self.checkpoint.compute_dtype).unsqueeze(0)     # only these rows
        recorder.record("embed", -1, x=detached(x))
        stream = DepthStream(x, cfg.residual, cfg.attnres_block_size)
        for i in range(cfg.num_layers):
            t0 = time.perf_counter()
            self.block(i)(stream, cache, recorder, None, hooks)
            if self.progress is not None:
                self.progress(i + 1, cfg.num_layers, time.perf_counter() - t0)
        out_res, final_norm, lm_head = self._head()
        uniform = hooks is not None and cfg.num_layers in hooks.uniform_depth    # a what-if's UniformDepth, as TinyK3
        h, weights = stream.read(out_res, uniform)
        recorder.record("depth", cfg.num_layers, site="out", weights=None if weights is None else detached(weights),
                        h=detached(h))
        logits = lm_head(final_norm(h))
        recorder.record("logits", cfg.num_layers, logits=detached(logits))
        cache.position += tokens.shape[1]
        return logits, cache


class RealSimulation(Simulation):
    """A sim.Simulation over a released-format checkpoint: the same timeline, Frames and stepping (Simulation's
    own __init__ and frame code), with the streamed model as its model, the chosen tokenizer as its tokenizer,
    and no twin (its bytes come from the formula, as for any twin-less run)."""

    def __init__(self, folder, prompt: str, *, device: str | None = "cpu", keep: bool = False, progress=None,
                 check_memory: bool = True, tokenizer: str = "auto", layers: int | None = None):
        """folder: a released-format folder or an open Checkpoint. progress(layer, layers, seconds) after each
        layer of each token. tokenizer: "auto" (the checkpoint's own where its files are there, else bytes),
        "checkpoint" or "bytes" (`choose_tokenizer`). layers: stream a truncated model (Checkpoint)."""
        resolve_device(device or "cpu")            # a clear error when CUDA is asked for but absent, before any work
        checkpoint = folder if isinstance(folder, Checkpoint) else Checkpoint(folder, layers=layers)
        self.checkpoint = checkpoint
        self.tokenizer = choose_tokenizer(checkpoint.folder, tokenizer)
        vocab = checkpoint.config.vocab_size
        if self.tokenizer.num_tokens > vocab:
            raise ValueError(f"the tokenizer ({self.tokenizer.name}) has {self.tokenizer.num_tokens} ids but this "
                             f"checkpoint's embedding has {vocab} rows.")
        if check_memory:
            check_ram(checkpoint, keep)
        self._stream_options = dict(keep=keep, progress=progress)
        # prefill=False: every prompt token is one streamed decode step, so each reads only its own 16 experts
        # per layer (the point of streaming, and what bytes_read(position) reports); a batched prefill would
        # read the union of a whole segment's experts at once.
        super().__init__(checkpoint.config, prompt, device=device or "cpu", weights="random", twin=False,
                         prefill=False)

    def _build_models(self, weights: str, twin: bool):
        model = StreamedK3(self.checkpoint, self.device, **self._stream_options)
        return model, f"{RELEASED}{self.checkpoint.folder.name}", None, "none"


def choose_tokenizer(folder: Path, choice: str = "auto"):
    """The tokenizer of a run over `folder`: "checkpoint" (its tiktoken.model and tokenizer_config.json, read by
    tiny_k3.tokenizer.CheckpointTokenizer: an error when they are missing), "bytes" (tiny_k3.tokenizer's), or
    "auto": the checkpoint's where both files are there, else bytes."""
    if choice not in ("auto", "checkpoint", "bytes"):
        raise ValueError(f"--tokenizer must be auto, checkpoint or bytes, got {choice!r}.")
    has_files = all((Path(folder) / name).is_file() for name in TOKENIZER_FILES)
    if choice == "bytes" or (choice == "auto" and not has_files):
        return BYTES
    return CheckpointTokenizer(folder)


# ---------------------------------------------------------------------------- the command
def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"


def _real_parser():
    import argparse

    from .real_download import DEFAULT_REPO

    p = argparse.ArgumentParser(prog="python -m sim real", description="Stream a released-format K3 checkpoint "
                                "from DIR layer by layer and show each token's routing, bytes read and time.")
    p.add_argument("dir", help="folder with config.json, model.safetensors.index.json and the shards")
    p.add_argument("--synthetic", action="store_true", help="first write a tiny synthetic release (the released "
                   "names, dtypes and MXFP4 experts, random weights) into DIR, which must be empty or missing (or "
                   "hold one written before), then stream it: the format tried without 1.56 TB")
    p.add_argument("--prompt", default="Hi")
    p.add_argument("--tokens", type=int, default=4, help="tokens to generate after the prompt")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cpu)")
    p.add_argument("--keep", action="store_true", help="keep every layer's non-expert weights in RAM after "
                   "the first token (experts are still read per token)")
    p.add_argument("--save", metavar="RUN.npz", default=None, help="write the Frames as a run file "
                   "(sim.runfile; `tiny-k3 --open RUN.npz` shows it read-only)")
    p.add_argument("--disk-gbps", type=float, default=2.0, help="disk speed for the time estimate (GB/s)")
    p.add_argument("--tokenizer", default="auto", choices=("auto", "checkpoint", "bytes"),
                   help="the checkpoint's own BPE (tiktoken.model + tokenizer_config.json, needs tiktoken), byte "
                   "tokens, or auto: the checkpoint's where its files are in DIR, else bytes")
    p.add_argument("--layers", type=int, default=None, metavar="N", help="stream only the first N layers, then the "
                   "head: a truncated model (N must end on an MLA layer: 4, 8, ... for K3); its tokens are not K3's")
    p.add_argument("--download", metavar="LAYERS", default=None, help="first fetch into DIR, through "
                   "huggingface_hub, the config, index, tokenizer and only the shards LAYERS (e.g. 0-3) need; "
                   "implies --layers (last of LAYERS) + 1")
    p.add_argument("--repo", default=DEFAULT_REPO, help=f"the hub repo --download reads (default {DEFAULT_REPO})")
    return p


def main_real(argv: list[str], console) -> int:
    """`python -m sim real DIR [--synthetic] [--prompt TEXT] [--tokens N] [--save RUN.npz] [--device D] [--keep]
    [--tokenizer auto|checkpoint|bytes] [--layers N] [--download LAYERS [--repo ID]]`."""
    args = _real_parser().parse_args(argv)
    try:
        if args.tokens < 0:
            raise ValueError(f"--tokens must be 0 or more, got {args.tokens}.")
        resolve_device(args.device or "cpu")     # no GPU for --device cuda: said before anything is read
        _fill_folder(args, console)
        checkpoint = Checkpoint(args.dir, layers=args.layers)   # (the errors about the folder come before any token)
        if args.save:
            prompt_tokens = len(choose_tokenizer(checkpoint.folder, args.tokenizer).encode(args.prompt))
            check_save_disk(checkpoint.config, prompt_tokens + args.tokens, args.save)
        sim = _stream(checkpoint, args, console)
        if args.save:
            from .runfile import save
            save(sim, args.save)
    except (ValueError, MemoryError, OSError) as exc:     # ReleasedFormatError and ConfigError are ValueErrors
        console.print(f"[red]error:[/red] {exc}")
        return 2
    _report(sim, args, console)
    return 0


def _fill_folder(args, console) -> None:
    """What DIR needs before it is opened: the shards --download names (sim/real_download.py), or a synthetic
    release for --synthetic (sim/real_synthetic.py). Both at once would write two things into one folder."""
    if args.synthetic and args.download is not None:
        raise ValueError("--synthetic writes its own release into DIR; it cannot be combined with --download.")
    if args.download is not None:
        from .real_download import download
        layers = download(args.dir, args.download, args.repo, say=console.print)
        args.layers = args.layers or layers[-1] + 1
    if args.synthetic:
        from .real_synthetic import prepare_synthetic
        folder, written = prepare_synthetic(args.dir)
        files = sum(1 for p in folder.iterdir() if p.is_file())
        size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        console.print(f"{'wrote' if written else 'found'} a synthetic release in {folder}: {files} files, "
                      f"{_size(size)} (the released names, dtypes and MXFP4 experts; random weights, not K3's)")


def _stream(checkpoint: Checkpoint, args, console) -> RealSimulation:
    """Run the prompt and args.tokens more through the stream under a progress bar: the layer being read, its
    time, the bytes read for this token so far and the time a token takes at this rate."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                   console=console, transient=True)
    task = bar.add_task("reading the checkpoint", total=checkpoint.config.num_layers, info="")
    spent: list[float] = []                    # this token's layer times

    def progress(done, total, seconds):
        spent[:] = ([] if done == 1 else spent) + [seconds]
        token = checkpoint.token
        bar.update(task, completed=done, total=total, description=f"token {token}: layer",
                   info=f"{1e3 * seconds:.0f} ms this layer · {_size(checkpoint.bytes_read(token))} read · about "
                        f"{sum(spent) / done * total:.1f} s a token")

    with bar:
        sim = RealSimulation(checkpoint, args.prompt, device=args.device, keep=args.keep, progress=progress,
                             tokenizer=args.tokenizer)
        sim.run(args.tokens)
    return sim


def _report(sim: RealSimulation, args, console) -> None:
    from rich.table import Table

    cfg, ck = sim.config, sim.checkpoint
    layer = cfg.moe_layers[0]
    t = Table(title=f"{ck.folder.name}: {cfg.num_layers} layers ({len(cfg.kda_layers)} KDA + {len(cfg.mla_layers)} "
                    f"MLA), {cfg.top_k} of {cfg.num_experts} experts, streamed from disk", title_justify="left")
    for name in ("pos", "in", "→ next", f"experts L{layer}", "bytes read", "of them experts", "ms",
                 f"at {args.disk_gbps:g} GB/s"):
        t.add_column(name)
    for f in sim.frames:
        read = ck.bytes_read(f.position)
        experts = sum(b for tok, n, b in ck.reads if tok == f.position and ".experts." in n)
        ids = " ".join(str(int(e)) for e in sorted(f.routing_for(layer).expert_ids))
        t.add_row(str(f.position), f.input_text, f.token_text, ids, _size(read), _size(experts), f"{f.step_ms:.0f}",
                  f"{read / (args.disk_gbps * 1e9):.3g} s", style="dim" if f.extra.get("prompt") else None)
    console.print(t)
    console.print(f"tokenizer: {sim.tokenizer.name}")
    if ck.is_truncated:
        console.print(f"[yellow]truncated model:[/yellow] the first {cfg.num_layers} of {ck.full_config.num_layers} "
                      f"layers, then the head; its tokens are not the checkpoint's own (nor K3's).")
    console.print(f"text: {sim.text!r}")
    if args.save:
        console.print(f"saved {len(sim.frames)} frames to {args.save} (tiny-k3 --open {args.save} shows them, "
                      f"read-only)")
