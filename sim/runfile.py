"""Runs you can keep: a whole Simulation (prompt, preset, seed, weights id, every Frame) in one safe file.

    sim.save("run.npz")                # or runfile.save(sim, path, cursor=i)
    sim2 = sim.load("run.npz")         # a live Simulation again, at the saved cursor: it can step on
    run = runfile.read("run.npz")      # no model at all: run.meta, run.frames, run.arrays (numpy tables)

Format (version 1): one uncompressed-by-default numpy .npz archive, read with `allow_pickle=False`, so
nothing in it is ever unpickled. Member "meta.json" holds UTF-8 JSON (format name, version, preset and its
config, prompt, seeds, temperature, weights and their id, cursor, the record layout of a frame); every
other member is one array over all F frames, named "<record>.<field>":

    frame.*       index, position, input_id, token_id, forced, step_ms, twin_step_ms, embed_norm [F]
    extra.*       prompt [F] bool, temperature [F] float64 (NaN: forced), seed [F] int64 (-1: forced)
    top.*         ids [F, 5] int64, probs [F, 5] float32
    routing.*     scores, bias [F, R, E] float32; expert_ids [F, R, k] int64; weights [F, R, k] float32
    kda.*         state [F, L, H, K, V] float16; decay [F, L, H, K]; beta, state_norm, correction_norm [F, L, H]
    depth.*       weights [F, sum N] float32 (the reads' N concatenated, sizes in meta), h_norm [F, D] float64
    sublayer.*    out_norm [F, S] float64
    memory.*      kv_bytes, state_bytes, twin_kv_bytes [F] int64, layer_bytes [F, layers] int64

R, L, D, S: the MoE layers, KDA layers, depth reads and sublayers of one token, listed in meta in order.
`load` rebuilds the model from (preset, seed, weights), replays the recorded choices through it (the
decode state is recomputed, not stored) and checks that every recomputed Frame equals the stored one,
so a file from other weights or another version says so in one sentence instead of showing wrong frames.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tiny_k3.config import K3Config
from tiny_k3.tokenizer import BYTES, StoredTokenizer, token_text
from tiny_k3.weights import weights_path

from .frame import DepthRecord, Frame, KDARecord, MemoryRecord, RoutingRecord, SublayerRecord, depth_source_names
from .session import Simulation

FORMAT = "tiny-k3 run"
RELEASED = "released "        # the weights label of a run streamed from a released-format folder (sim/real.py)
VERSION = 1


@dataclass(frozen=True)
class SavedRun:
    """A run file read without any model: its metadata, its Frames and the arrays they came from."""

    meta: dict
    frames: list[Frame]
    arrays: dict[str, np.ndarray]   # "<record>.<field>" -> [F, ...] (the tables a notebook plots)


# ---------------------------------------------------------------------------- writing


def weights_id(sim: Simulation) -> str:
    """What made the weights: "trained <file> sha256:<12 hex>" or "random init, seed N"."""
    if sim.weights.startswith(RELEASED):   # streamed from a released-format folder (sim/real.py): its name
        return sim.weights
    if sim.weights == "trained":
        path = weights_path(sim.config.name)
        return f"trained {path.name} sha256:{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"
    return f"random init, seed {sim.seed}"


def _layout(frame: Frame) -> dict:
    return {"routing_layers": [r.layer for r in frame.routing], "kda_layers": [r.layer for r in frame.kda],
            "depth_reads": [[d.layer, d.site, int(d.weights.size)] for d in frame.depth],
            "sublayers": [[s.layer, s.site, s.kind] for s in frame.sublayers]}


def _arrays(frames: list[Frame]) -> dict[str, np.ndarray]:
    def stack(get, dtype=None) -> np.ndarray:
        return np.stack([np.asarray(get(f), dtype=dtype) for f in frames])

    def each(records, field, dtype=None):
        return lambda f: np.stack([np.asarray(getattr(r, field), dtype=dtype) for r in getattr(f, records)]) \
            if getattr(f, records) else np.zeros(0, dtype or np.float32)

    out = {f"frame.{k}": stack(lambda f, k=k: getattr(f, k), dt) for k, dt in (
        ("index", np.int64), ("position", np.int64), ("input_id", np.int64), ("token_id", np.int64),
        ("forced", np.bool_), ("step_ms", np.float64), ("twin_step_ms", np.float64), ("embed_norm", np.float64))}
    out["extra.prompt"] = stack(lambda f: f.prompt, np.bool_)
    out["extra.temperature"] = stack(lambda f: math.nan if f.temperature is None else f.temperature, np.float64)
    out["extra.seed"] = stack(lambda f: -1 if f.seed is None else f.seed, np.int64)
    out["top.ids"], out["top.probs"] = stack(lambda f: f.top_ids), stack(lambda f: f.top_probs)
    for field in ("scores", "bias", "expert_ids", "weights"):
        out[f"routing.{field}"] = stack(each("routing", field))
    for field in ("state", "decay", "beta", "state_norm", "correction_norm"):
        out[f"kda.{field}"] = stack(each("kda", field))
    out["depth.weights"] = stack(lambda f: np.concatenate([d.weights for d in f.depth] or [np.zeros(0, np.float32)]))
    out["depth.h_norm"] = stack(lambda f: [d.h_norm for d in f.depth], np.float64)
    out["sublayer.out_norm"] = stack(lambda f: [s.out_norm for s in f.sublayers], np.float64)
    for field in ("kv_bytes", "state_bytes", "twin_kv_bytes", "layer_bytes"):
        out[f"memory.{field}"] = stack(lambda f, k=field: getattr(f.memory, k), np.int64)
    return out


def save(sim: Simulation, path, cursor: int | None = None) -> Path:
    """Write `sim` to `path` (an .npz archive, see the module docstring); `cursor` defaults to sim.cursor.

    The file appears whole or not at all (written beside it, then renamed), so quitting mid-save loses nothing.
    """
    path = Path(path)
    frames = list(sim.frames)          # a snapshot: a worker may be appending to the live list meanwhile
    cursor = sim.cursor if cursor is None else cursor
    if not isinstance(cursor, (int, np.integer)) or not 0 <= cursor < len(frames):
        raise ValueError(f"cursor must be a frame number from 0 to {len(frames) - 1}, got {cursor!r}.")
    layout = _layout(frames[0])
    if any(_layout(f) != layout for f in frames):
        raise ValueError("the frames of this run do not share one record layout, so they cannot be stacked.")
    meta = {
        "format": FORMAT, "version": VERSION, "preset": sim.config.name,
        "config": dataclasses.asdict(sim.config), "prompt": sim.prompt, "seed": sim.seed,
        "sample_seed": sim.sample_seed, "temperature": sim.temperature, "weights": sim.weights,
        "weights_id": weights_id(sim), "twin": sim.twin_model is not None, "prompt_len": sim.prompt_len,
        "cursor": int(cursor), "frames": len(frames), **layout,
    }
    if sim.weights.startswith(RELEASED) or sim.tokenizer is not BYTES:
        meta["tokenizer"] = tokenizer_meta(sim.tokenizer, frames)
    members = {"meta.json": np.frombuffer(json.dumps(meta).encode(), np.uint8), **_arrays(frames)}
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as fh:
        np.savez(fh, **members)
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------- reading


def _frames(meta: dict, a: dict[str, np.ndarray]) -> list[Frame]:
    reads, offsets = meta["depth_reads"], np.cumsum([0] + [n for _, _, n in meta["depth_reads"]])
    names = depth_source_names(meta["config"]["residual"], meta["config"]["attnres_block_size"], len(reads))
    frames = []
    for i in range(meta["frames"]):
        def col(name, i=i):
            return a[name][i]
        routing = tuple(RoutingRecord(layer, *(col(f"routing.{k}")[j] for k in ("scores", "bias", "expert_ids",
                                                                                "weights")))
                        for j, layer in enumerate(meta["routing_layers"]))
        kda = tuple(KDARecord(layer, *(col(f"kda.{k}")[j] for k in ("state", "decay", "beta", "state_norm",
                                                                      "correction_norm")))
                    for j, layer in enumerate(meta["kda_layers"]))
        depth = tuple(DepthRecord(layer, site, col("depth.weights")[offsets[j]:offsets[j + 1]],
                                  float(col("depth.h_norm")[j])) for j, (layer, site, _) in enumerate(reads))
        subs = tuple(SublayerRecord(layer, site, kind, float(col("sublayer.out_norm")[j]))
                     for j, (layer, site, kind) in enumerate(meta["sublayers"]))
        memory = MemoryRecord(int(col("memory.kv_bytes")), int(col("memory.state_bytes")),
                              int(col("memory.twin_kv_bytes")), tuple(int(x) for x in col("memory.layer_bytes")))
        forced, t, s = bool(col("frame.forced")), float(col("extra.temperature")), int(col("extra.seed"))
        inp, tok = int(col("frame.input_id")), int(col("frame.token_id"))
        frames.append(Frame(
            index=int(col("frame.index")), position=int(col("frame.position")), input_id=inp,
            input_text=token_text(inp), token_id=tok, token_text=token_text(tok), top_ids=col("top.ids"),
            top_probs=col("top.probs"), routing=routing, kda=kda, depth=depth, sublayers=subs, memory=memory,
            step_ms=float(col("frame.step_ms")), twin_step_ms=float(col("frame.twin_step_ms")), forced=forced,
            embed_norm=float(col("frame.embed_norm")), prompt=bool(col("extra.prompt")),
            temperature=None if forced else t, seed=None if forced else s, depth_sources=names))
    return frames


def read(path) -> SavedRun:
    """The run in `path` without building any model; one clear ValueError for a wrong or damaged file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"there is no run file at {path}.")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        meta = json.loads(arrays.pop("meta.json").tobytes().decode())
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path.name} is not a readable tiny-k3 run file ({type(exc).__name__}); "
                         f"it may be damaged or another kind of file.") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path.name} is not a tiny-k3 run file (no '{FORMAT}' header).")
    if meta.get("version") != VERSION:
        raise ValueError(f"{path.name} is a version {meta.get('version')} run file; this tiny-k3 reads version "
                         f"{VERSION} only, so open it with the version that saved it.")
    try:
        frames = _frames(meta, arrays)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ValueError(f"{path.name} is damaged: its frames do not match its header ({type(exc).__name__}).") \
            from None
    if "tokenizer" in meta:
        frames = relabelled(frames, stored_tokenizer(meta))
    return SavedRun(meta, frames, arrays)


def _choice(frame: Frame) -> dict:
    if frame.forced:
        return {"force_token": frame.token_id}
    return {"temperature": frame.temperature, "seed": frame.seed}


def load(path, *, device: str | None = "cpu", progress=None) -> Simulation:
    """Reopen a saved run as a live Simulation at its saved cursor (see the module docstring); a run streamed
    from a released checkpoint (sim/real.py) opens read-only, as a StreamedRun.

    progress(done, total) is called as frames are recomputed (Simulation's prompt prefill, then the rest).
    """
    run = read(path)
    meta, saved = run.meta, run.frames
    name = Path(path).name
    if str(meta.get("weights", "")).startswith(RELEASED):
        return StreamedRun(run, name)
    total = len(saved)
    sim = Simulation(meta["preset"], meta["prompt"], seed=meta["seed"], device=device, weights=meta["weights"],
                     twin=meta["twin"], progress=None if progress is None else (lambda done, _: progress(done, total)))
    if weights_id(sim) != meta["weights_id"]:
        raise ValueError(f"{name} was recorded with weights '{meta['weights_id']}' but this installation has "
                         f"'{weights_id(sim)}', so its frames cannot be reproduced.")
    for i in range(total - 1):            # frame i's choice is frame i + 1's input: replay every choice
        have = sim.frames
        if i + 1 < len(have) and have[i].token_id == saved[i].token_id and have[i].forced == saved[i].forced:
            continue
        sim.goto(i)
        sim.step(**_choice(saved[i]))
        if progress is not None:
            progress(i + 2, total)
    sim.temperature, sim.sample_seed = meta["temperature"], meta["sample_seed"]
    bad = next((i for i, (a, b) in enumerate(zip(sim.frames, saved)) if not a.same_as(b)), None)
    if bad is not None or len(sim.frames) != total:
        raise ValueError(f"{name} does not replay to the frames it holds (frame {bad} differs), so it was made "
                         f"by another version of tiny-k3 or its model code.")
    sim.goto(meta["cursor"])
    return sim


# ---------------------------------------------------------------------------- runs streamed from a released checkpoint
def tokenizer_meta(tokenizer, frames: list[Frame]) -> dict:
    """What a run file keeps of its tokenizer: its name and size, and the bytes (latin-1 text; None for a special)
    and label of every id its frames hold (inputs, choices, top-5), so the run shows and decodes without it."""
    ids = sorted({i for f in frames for i in (f.input_id, f.token_id, *map(int, f.top_ids))})
    pieces = [tokenizer.token_bytes(i) for i in ids]
    return {"name": tokenizer.name, "num_tokens": tokenizer.num_tokens, "bos": tokenizer.bos, "ids": ids,
            "pieces": [None if p is None else p.decode("latin-1") for p in pieces],
            "labels": [tokenizer.token_text(i) for i in ids]}


def stored_tokenizer(meta: dict) -> StoredTokenizer:
    t = meta["tokenizer"]
    pieces = {i: None if p is None else p.encode("latin-1") for i, p in zip(t["ids"], t["pieces"])}
    return StoredTokenizer(t["name"], t["num_tokens"], t["bos"], pieces, dict(zip(t["ids"], t["labels"])))


def relabelled(frames: list[Frame], tokenizer) -> list[Frame]:
    """Frames with their input and token texts from `tokenizer` (a file stores ids; the byte labels are the
    default)."""
    return [dataclasses.replace(f, input_text=tokenizer.token_text(f.input_id),
                                token_text=tokenizer.token_text(f.token_id)) for f in frames]


def config_from_dict(fields: dict) -> K3Config:
    """A K3Config from its dataclasses.asdict in a run file's meta (JSON made its tuples lists)."""
    return K3Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


class StreamedRun(Simulation):
    """A run streamed from a released checkpoint (sim/real.py), reopened from its file without the weights.

    Every recorded Frame can be looked at (routing, KDA state, depth weights, memory) and stepped through;
    nothing can be computed: a step past the last frame, a changed choice, a what-if or a recall moment is a
    ValueError saying so (`read_only_reason`). The attributes are those a Simulation has (sim/session.py)."""

    def __init__(self, run: SavedRun, name: str):
        meta = run.meta
        self.config = config_from_dict(meta["config"])
        self.twin_config = self.config.twin()
        self.seed, self.sample_seed, self.temperature = meta["seed"], meta["sample_seed"], meta["temperature"]
        self.prompt, self.prompt_len, self.weights = meta["prompt"], meta["prompt_len"], meta["weights"]
        self.tokenizer = stored_tokenizer(meta) if "tokenizer" in meta else BYTES
        self.device = torch.device("cpu")
        self.model, self.twin_model, self.twin_weights = None, None, "none"
        self._frames, self._logits, self._snapshots = list(run.frames), [], {}
        self.cursor = meta["cursor"]
        self.read_only_reason = (f"{name} was streamed from a released checkpoint ({meta['weights']}) whose weights "
                                 f"are not here: its frames can be looked at, not extended, changed or recomputed; "
                                 f"stream the folder again with `python -m sim real`.")

    def step(self, force_token=None, temperature=None, seed=None) -> Frame:
        if force_token is None and temperature is None and seed is None and self.cursor + 1 < len(self._frames):
            self.cursor += 1
            return self.frame
        raise ValueError(self.read_only_reason)

    def what_if(self, *changes, **options):
        raise ValueError(self.read_only_reason)

    def recall_moment(self, i: int | None = None):
        raise ValueError(self.read_only_reason)
