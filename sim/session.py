"""Simulation: a prompt stepped through tiny_k3 one token at a time, recorded as a timeline of Frames.

    sim = Simulation("small", "k=4; m=7; a red box. | m=", seed=0)
    sim.step()            # decode one token -> Frame
    sim.back(); sim.step(force_token="9")   # branch: a different choice from the saved decode state

Timeline rule: frame i processes the input token at position i; `frame.token_id` is the token that follows
it (the next prompt token, or the one chosen from frame i's logits). Every token, prompt or generated, has its
Frame. The prompt but its last token goes through the model 64 tokens a forward and is recorded per token from
those batched forwards (sim/prefill.py: the same frames to float rounding, tested); its last token, and with
prefill=False every token, is one step of the cached decode path, as every generated token is.

Beside the hybrid runs its softmax twin (`config.twin()`: every attention layer gated MLA), teacher-forced
on the same tokens, so every Frame carries both models' measured cache bytes and step times.

Branching. A KDA layer's decode state is a fixed-size copy; an MLA cache is a prefix that can be cut
(`MLACache.truncate`). So a branch restores the KDA states saved every SNAPSHOT_EVERY tokens (and for the
last RECENT_SNAPSHOTS tokens), truncates the MLA caches to the same position and replays the recorded
tokens up to the cursor. The all-MLA twin needs no snapshot at all: a truncation is its whole restore.
A saved snapshot keeps its KDA states whole every KEYFRAME_EVERY tokens; the ones between keep only the
conv tails, their states being those their frame recomputes (sim/framestore.py: a frame's KDA states are
recomputed from the keyframe and each step's kda_step inputs, bit for bit).
"""

from __future__ import annotations

import copy
import dataclasses
import operator
import time
from pathlib import Path

import numpy as np
import torch

from tiny_k3.cache import KDAState, MLACache, ModelCache
from tiny_k3.config import DEFAULT_PRESET, DEFAULT_PROMPT, K3Config
from tiny_k3.model import WEIGHTS, load_model, resolve_device
from tiny_k3.probe import Recorder
from tiny_k3.tokenizer import BYTES, EOS
from tiny_k3.weights import config_for

from . import runfile
from .frame import Choice, Frame, SublayerView, depth_source_names
from .memory import non_negative_int
from .prompt import prompt_ids
from .twin_tails import TwinTails
from .kdastates import KDA_CHAIN, KDALinks, LeanKDAState
from .prefill import memory_record, run_segment, segment_snapshots, segments
from .recorder import FrameRecorder, StepRecord, Tee
from .interventions import layer_span
from .sampling import choose_token, generator_seed, sample_token, token_id, top_tokens  # noqa: F401  (sim.session.sample_token)
from .whatif import WhatIf, WhatIfPlan, what_if

NUM_TOKENS = EOS + 1     # 256 bytes, BOS, EOS: the tokens that exist
SNAPSHOT_EVERY = 16     # keep the KDA states every 16 tokens: a branch replays at most 15 tokens
RECENT_SNAPSHOTS = 16   # ... and after each of the last 16 tokens (a fixed cost): going back a little replays nothing
KEYFRAME_EVERY = KDA_CHAIN  # a snapshot every 64 tokens keeps its KDA states whole: the frames' states are
                            # recomputed from it (sim/framestore.py); the others keep the conv tails and
                            # recompute S from their frame when a branch restores them


# ---------------------------------------------------------------------------- set-up


def _resolve_config(preset) -> K3Config:
    """A K3Config as given, a preset's, or a checkpoint name's ("small-twin": the all-MLA twin of `small`)."""
    return preset if isinstance(preset, K3Config) else config_for(preset)


def _build_models(config: K3Config, weights: str, seed: int, device: torch.device, twin: bool):
    """(model, source, twin_model or None, twin_source); source is "trained" or "random"."""
    model, source = load_model(config, weights, seed, device)
    if not twin:
        return model, source, None, "none"
    # trained twin weights ship as "<preset>-twin"; beside random weights (or without them) it starts from `seed`
    twin_model, twin_source = load_model(config.twin(), "auto" if source == "trained" else "random", seed, device)
    return model, source, twin_model, twin_source


def _temperature(value) -> float:
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"temperature must be a number, 0 (greedy) or more, got {value!r}.") from None
    if not t >= 0 or t == float("inf"):
        raise ValueError(f"temperature must be 0 (greedy) or a positive finite number, got {value!r}.")
    return t


# ---------------------------------------------------------------------------- the simulation


class Simulation:
    """A prompt, a timeline of Frames and a cursor over it; see the module docstring (the API) and README.md.

    Choices. A frame's `token_id` is chosen when the frame is made: the next prompt token (forced), or a
    sample from its logits with (temperature, seed) = (sim.temperature, sim.sample_seed) at the frame's
    position (recorded in frame.temperature and frame.seed; frame.prompt marks prompt frames; frame.choice).
    `step(force_token, temperature, seed)` may change that choice for the current frame: a changed choice
    branches (the frames after the cursor are dropped, the decode state after the cursor is restored, and
    generation goes on from there). A branch equals a fresh Simulation that made the same calls. Setting
    sim.temperature directly affects only frames made later.

    Memory (bench/bench_sim.py --memory-only): about 6.5 KB per token for "tiny", 37 KB for "small" and
    340 KB for "k3-topo" (a frame's arrays, its Python objects and the saved snapshots' share), plus once
    per timeline the selection bias (1.3 KB, 25 KB, 330 KB) and a fixed ring of 16 recent snapshots
    (52 KB, 1.0 MB, 11.6 MB).
    """

    tokenizer = BYTES   # text <-> ids <-> labels (tiny_k3.tokenizer); sim.real puts a checkpoint's own BPE here

    def __init__(self, preset: str | K3Config = DEFAULT_PRESET, prompt: str = DEFAULT_PROMPT, *, seed: int = 0,
                 device: str | None = "cpu", temperature: float = 0.0, weights: str = "auto", twin: bool = True,
                 progress=None, prefill: bool = True):
        """progress(done, total), if given, is called for each prompt token as it is recorded; whatever it raises
        abandons the build (a front end's cancel: the TUI stops a long k3-topo prefill between segments).
        prefill: record the prompt from batched forwards (sim/prefill.py); False: one decode step a token."""
        self.config = _resolve_config(preset)
        self.twin_config = self.config.twin()
        self.seed = non_negative_int(seed, "seed")
        self.sample_seed = self.seed
        self.temperature = _temperature(temperature)
        if weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}.")
        ids = prompt_ids(prompt, self.config, self.tokenizer)
        self.device = resolve_device(device)
        self.prompt = prompt
        self.model, self.weights, self.twin_model, self.twin_weights = self._build_models(weights, twin)

        self._frames: list[Frame] = []
        self._logits: list[np.ndarray] = []          # [NUM_TOKENS] float32 per frame: a changed choice resamples these
        self._cache = ModelCache(self.config.num_layers)
        self._twin_cache = ModelCache(self.config.num_layers)
        self._snapshots: dict[int, dict[int, KDAState]] = {}   # tokens seen -> {KDA layer: state after them}
        self._twin_tails, self._own_tails = TwinTails(self.twin_model), TwinTails(self.model)   # short-conv tails
        self._bias_cache: dict = {}
        self._kda_links = KDALinks()                 # frames' KDA states are recomputed from the step before
        self._off_timeline_links = KDALinks()        # ... and a what-if's from its own step before
        self._ints: dict[int, int] = {}
        self.prefilled = bool(prefill)               # how the prompt was recorded (a run file replays it so)
        if self.prefilled:
            self._prefill(ids, progress)
        for i in range(len(self._frames), len(ids)):   # (stepping: all of them)
            self._advance(ids[i], self._prompt_choice(ids, i), prompt=True)
            if progress is not None:
                progress(i + 1, len(ids))
        self.prompt_len = len(ids)
        self.cursor = len(ids) - 1

    # ------------------------------------------------------------------ the timeline
    @property
    def frames(self) -> list[Frame]:
        """The whole timeline, prompt frames first (the live list: read it, do not modify it)."""
        return self._frames

    @property
    def frame(self) -> Frame:
        return self._frames[self.cursor]

    @property
    def text(self) -> str:
        """The timeline's text up to the cursor: its input tokens and the token chosen after the cursor."""
        ids = [f.input_id for f in self._frames[:self.cursor + 1]] + [self.frame.token_id]
        return self.tokenizer.decode(ids)

    def back(self) -> Frame:
        if self.cursor == 0:
            raise ValueError("already at the first token; there is nothing before it to go back to.")
        self.cursor -= 1
        return self.frame

    def goto(self, i: int) -> Frame:
        self.cursor = self._index(i)
        return self.frame

    def run(self, n: int) -> list[Frame]:
        n = non_negative_int(n, "the number of steps")
        last = self.config.max_seq_len - 1
        if self.cursor + n > last:
            raise ValueError(f"{n} more steps would pass the last position ({last}) that preset "
                             f"{self.config.name!r} allows; at most {last - self.cursor} remain.")
        return [self.step() for _ in range(n)]

    def step(self, force_token: int | str | None = None, temperature: float | None = None,
             seed: int | None = None) -> Frame:
        """One token forward: replay the next frame, generate a new one, or branch on a changed choice.

        force_token (an id or one character) replaces the token chosen after the current frame. temperature
        and seed become the session's sampling settings (sim.temperature, sim.sample_seed) and re-choose that
        token with them when they differ from how it was chosen. Either way a changed choice branches.
        """
        frame = self.frame
        forced = None if force_token is None else token_id(force_token, self.tokenizer)
        t = self.temperature if temperature is None else _temperature(temperature)
        s = self.sample_seed if seed is None else non_negative_int(seed, "seed")
        if self.cursor + 1 >= self.config.max_seq_len:
            raise ValueError(f"the timeline is full: preset {self.config.name!r} allows {self.config.max_seq_len} "
                             f"tokens, prompt plus generated; go back or start a new Simulation.")
        self.temperature, self.sample_seed = t, s          # all inputs are valid: now change things
        if forced is not None:
            choice = Choice.forced(forced)
        elif temperature is not None or seed is not None:
            choice = Choice.sampled(t, s)
        else:
            choice = frame.choice

        if not choice.same_as(frame.choice):
            self._branch(choice)
        elif self.cursor + 1 < len(self._frames):
            self.cursor += 1
            return self.frame
        self._advance(self.frame.token_id, Choice.sampled(self.temperature, self.sample_seed), prompt=False)
        self.cursor = len(self._frames) - 1
        return self.frame

    def what_if(self, *changes, at: int | None = None, steps: int = 1, progress=None) -> WhatIf:
        """What would the model have done at frame `at` (default: the cursor) if ... -> sim.whatif.WhatIf.

        changes: sim.interventions changes, or one sim.whatif.WhatIfPlan made from them. Recomputes frame `at`
        with the changes in force, then steps - 1 more tokens, beside the original, from the decode state
        before it (caches_at); the timeline and the cursor are left exactly as they were.
        progress(done, steps), if given, is called after each step; whatever it raises abandons the what-if.
        """
        plan = WhatIfPlan.of(changes[0] if len(changes) == 1 and isinstance(changes[0], WhatIfPlan) else changes,
                             self.config)
        return what_if(self, plan, self.cursor if at is None else self._index(at), steps, progress)

    def view(self, frames) -> "Simulation":
        """A read-only copy over other `frames` (a what-if's branch, sim.whatif.branch_timeline): the same model
        and config, its cursor on the last frame. The views over frames work; stepping it does not."""
        other = copy.copy(self)
        other._frames, other._logits = list(frames), []
        other.cursor = len(other._frames) - 1
        return other

    # ------------------------------------------------------------------ views over the timeline
    def step_into(self, i: int | None = None) -> list[SublayerView]:
        """Frame i's sublayers in execution order: embed, per layer attention then MLP, then the head."""
        f = self.frame if i is None else self._frames[self._index(i)]
        cfg = self.config
        depth = {(d.layer, d.site): d for d in f.depth}
        out = {(s.layer, s.site): s.out_norm for s in f.sublayers}
        views = [SublayerView(0, -1, "embed", "embed", f"embed · {f.input_text}", out_norm=f.embed_norm)]
        for layer in range(cfg.num_layers):
            kind = cfg.layer_kinds[layer]
            views.append(SublayerView(len(views), layer, "attn", kind, f"L{layer} attn · {kind.upper()}",
                                      depth=depth.get((layer, "attn")), kda=f.kda_for(layer),
                                      out_norm=out.get((layer, "attn"), 0.0)))
            mlp = "dense" if layer < cfg.first_k_dense else "moe"
            views.append(SublayerView(len(views), layer, "mlp", mlp, f"L{layer} mlp · {'MoE' if mlp == 'moe' else 'dense'}",
                                      depth=depth.get((layer, "mlp")), routing=f.routing_for(layer),
                                      out_norm=out.get((layer, "mlp"), 0.0)))
        head = depth.get((cfg.num_layers, "out"))
        top = tuple((int(t), self.tokenizer.token_text(int(t)), float(p)) for t, p in zip(f.top_ids, f.top_probs))
        views.append(SublayerView(len(views), cfg.num_layers, "head", "head", "head", depth=head,
                                  out_norm=0.0 if head is None else head.h_norm, top=top))
        return views

    def recall_moment(self, i: int | None = None):
        """sim.recall_moment.RecallMoment at frame i (default: the cursor), or None when its input is not the
        "=" of a recall query ("| q="): which KDA head reads the value back, which sublayers moved the answer."""
        from .recall_moment import recall_moment

        i = self.cursor if i is None else self._index(i)
        ids = [f.input_id for f in self._frames[:i + 1]]
        return recall_moment(self.model, ids, i)

    def expert_load(self, layer: int, upto: int | None = None) -> np.ndarray:
        """[E] int64: how many tokens each expert of an MoE layer took, over the frames up to the cursor
        (or up to frame `upto`, inclusive)."""
        if layer not in self.config.moe_layers:
            raise ValueError(f"layer {layer} has no MoE; MoE layers are {layer_span(self.config.moe_layers)}.")
        ids = [f.routing_for(layer).expert_ids for f in self._upto(upto)]
        return np.bincount(np.concatenate(ids), minlength=self.config.num_experts).astype(np.int64)

    def state_norm_history(self, layer: int, head: int, upto: int | None = None) -> np.ndarray:
        """[n] float32: ||S||_F of one KDA head after each frame up to the cursor (or frame `upto`)."""
        if layer not in self.config.kda_layers:
            raise ValueError(f"layer {layer} is not a KDA layer; KDA layers are {layer_span(self.config.kda_layers)}.")
        if not 0 <= head < self.config.kda_heads:
            raise ValueError(f"head {head} is out of range; KDA heads are 0 to {self.config.kda_heads - 1}.")
        return np.array([f.kda_for(layer).state_norm[head] for f in self._upto(upto)], np.float32)

    def memory_history(self, upto: int | None = None) -> dict[str, np.ndarray]:
        """Per frame up to the cursor (or frame `upto`): position, kv_bytes, state_bytes, twin_kv_bytes,
        step_ms, twin_step_ms."""
        frames = self._upto(upto)
        out = {"position": np.array([f.position for f in frames], np.int64)}
        for key in ("kv_bytes", "state_bytes", "twin_kv_bytes"):
            out[key] = np.array([getattr(f.memory, key) for f in frames], np.int64)
        for key in ("step_ms", "twin_step_ms"):
            out[key] = np.array([getattr(f, key) for f in frames], np.float64)
        return out

    def save(self, path, cursor: int | None = None):
        """Write the whole run to `path` (sim/runfile.py: JSON + npz, nothing pickled); `from_run` reopens it."""
        return runfile.save(self, path, cursor=cursor)

    @classmethod
    def from_run(cls, path, *, device: str | None = "cpu", progress=None, run: "runfile.SavedRun | None" = None
                 ) -> "Simulation":
        """Reopen a saved run as a live Simulation at its saved cursor (sim/runfile.py): the model rebuilt from
        (preset, seed, weights), the recorded choices replayed and every Frame checked against the file.
        progress(done, total) is called as frames are recomputed (the prompt's, then the rest). run: the file
        already read (runfile.read(path)), so a caller that looked at it first does not read it again."""
        run = runfile.read(path) if run is None else run
        name = Path(path).name
        runfile.check_replayable(run, name)
        total = len(run.frames)
        sim = cls(**runfile.simulation_args(run), device=device,
                  progress=None if progress is None else (lambda done, _: progress(done, total)))
        return runfile.replay(sim, run, name, progress)

    def snapshot_bytes(self) -> int:
        """Bytes held by the saved KDA states that make branching cheap."""
        return sum(s.nbytes() for snap in self._snapshots.values() for s in snap.values())

    def __repr__(self) -> str:
        return (f"Simulation(preset={self.config.name!r}, frames={len(self._frames)}, cursor={self.cursor}, "
                f"weights={self.weights!r}, device={str(self.device)!r})")

    # ------------------------------------------------------------------ internals
    def _build_models(self, weights: str, twin: bool):
        """(model, weights source, twin model or None, twin source): the models this timeline runs (sim.real
        gives a streamed checkpoint instead)."""
        return _build_models(self.config, weights, self.seed, self.device, twin)

    def _upto(self, upto: int | None) -> list[Frame]:
        """The frames up to the cursor, or up to frame `upto` (a UI thread reads while a worker steps)."""
        return self._frames[:(self.cursor if upto is None else self._index(upto)) + 1]

    def _index(self, i) -> int:
        n = len(self._frames)
        try:
            i = operator.index(i)
        except TypeError:
            raise ValueError(f"a frame number from 0 to {n - 1} is needed, got {i!r}.") from None
        if not 0 <= i < n:
            raise ValueError(f"frame {i} is out of range; valid frames are 0 to {n - 1}.")
        return i

    prefilled = False   # (a subclass that builds its own timeline, sim/real.py, steps its prompt)

    def _prompt_choice(self, ids: list[int], i: int) -> Choice:
        """Prompt frame i's choice: the next prompt token, or after the last one a sample as step() makes."""
        return Choice.forced(ids[i + 1]) if i + 1 < len(ids) else Choice.sampled(self.temperature, self.sample_seed)

    @torch.no_grad()
    def _prefill(self, ids: list[int], progress) -> None:
        """Record the prompt's frames but the last from one forward per segment (sim/prefill.py), and the
        snapshots that stepping keeps."""
        for start, end in segments(len(ids) - 1):   # the last token steps: the cursor's frame is a decode step's
                                                     # from the caches themselves, as a what-if recomputes it
            keyframe = self._snapshots.get(start) if start % KEYFRAME_EVERY == 0 else None
            seg = run_segment(self.model, self.twin_model, ids[start:end], self._cache, self._twin_cache,
                              FrameRecorder(self._bias_cache, self._kda_links, keyframe))
            self._cache, self._twin_cache = seg.cache, seg.twin_cache
            self._twin_tails.keep(self._twin_cache), self._own_tails.keep(self._cache)
            for p, rec in enumerate(seg.records, start):
                twin_cache = None if self.twin_model is None else self._twin_cache
                memory = memory_record(self._cache, twin_cache, self.twin_config, p + 1, self._ints)
                frame, logits = self._frame(rec, p, ids[p], self._prompt_choice(ids, p), True, memory,
                                            seg.step_ms, seg.twin_step_ms)
                self._frames.append(frame)
                self._logits.append(logits)
            self._snapshots.update(segment_snapshots(seg, self._frames, len(ids), SNAPSHOT_EVERY, RECENT_SNAPSHOTS,
                                                     KEYFRAME_EVERY))
            for done in range(start + 1, end + 1):
                if progress is not None:
                    progress(done, len(ids))

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def _advance(self, token: int, choice: Choice, prompt: bool) -> Frame:
        """Feed `token` at the next position to the hybrid (recorded) and the twin; append the Frame."""
        frame, logits, self._cache, self._twin_cache = self.compute_frame(
            len(self._frames), token, choice, prompt, self._cache, self._twin_cache)
        self._frames.append(frame)
        self._logits.append(logits)
        self._save_snapshot()
        self._twin_tails.keep(self._twin_cache), self._own_tails.keep(self._cache)
        return frame

    @torch.no_grad()
    def compute_frame(self, position: int, token: int, choice: Choice, prompt: bool, cache: ModelCache,
                       twin_cache: ModelCache | None, hooks=None, watch: Recorder | None = None):
        """One recorded decode step from `cache`, touching no timeline -> (Frame, logits, cache, twin_cache).

        twin_cache None: the twin is not run (its bytes come from the formula). hooks: tiny_k3.hooks changes
        in force (a what-if); watch: a second recorder that sees every event too (sim.whatif keeps outputs).
        """
        if cache.position != position:
            raise ValueError(f"compute_frame: a frame at position {position} needs the cache after {position} "
                             f"tokens, got one after {cache.position} (Simulation.caches_at makes it).")
        x = torch.tensor([[token]], device=self.device)
        # A frame at a keyframe position starts its KDA chain from that snapshot (sim/framestore.py).
        keyframe = self._snapshots.get(position) if position % KEYFRAME_EVERY == 0 else None
        links = self._kda_links if cache is self._cache else self._off_timeline_links
        recorder = FrameRecorder(self._bias_cache, links, keyframe)
        self._sync()
        t0 = time.perf_counter()
        _, cache = self.model(x, cache, recorder=recorder if watch is None else Tee(recorder, watch), hooks=hooks)
        self._sync()
        t1 = time.perf_counter()
        twin_ms = float("nan")
        if self.twin_model is not None and twin_cache is not None:
            _, twin_cache = self.twin_model(x, twin_cache)
            self._sync()
            twin_ms = 1e3 * (time.perf_counter() - t1)
        memory = memory_record(cache, None if self.twin_model is None else twin_cache, self.twin_config, position + 1,
                               self._ints)
        frame, logits = self._frame(recorder.finish(), position, token, choice, prompt, memory, 1e3 * (t1 - t0),
                                    twin_ms)
        return frame, logits, cache, twin_cache

    def _frame(self, rec: StepRecord, position: int, token: int, choice: Choice, prompt: bool, memory,
               step_ms: float, twin_ms: float) -> tuple[Frame, np.ndarray]:
        """The Frame of one recorded step and its logits [NUM_TOKENS]."""
        # Ids past EOS are padding rows of the embedding (vocab 512 > 258 tokens): never offer them.
        logits = rec.logits[:self.tokenizer.num_tokens]
        chosen = choose_token(logits, position, choice)
        top_ids, top_probs = top_tokens(logits)
        frame = Frame(
            index=position, position=position, input_id=token, input_text=self.tokenizer.token_text(token),
            token_id=chosen, token_text=self.tokenizer.token_text(chosen), top_ids=top_ids, top_probs=top_probs,
            routing=rec.routing, kda=rec.kda, depth=rec.depth, sublayers=rec.sublayers,
            memory=memory, step_ms=step_ms, twin_step_ms=twin_ms,
            embed_norm=rec.embed_norm, prompt=prompt, **choice.frame_fields(),
            depth_sources=depth_source_names(self.config.residual, self.config.attnres_block_size, len(rec.depth)))
        return frame, logits

    def _save_snapshot(self) -> None:
        p = self._cache.position
        self._snapshots[p] = {i: c.clone() for i, c in enumerate(self._cache.layers) if isinstance(c, KDAState)}
        old = p - RECENT_SNAPSHOTS
        if old > 0 and old % SNAPSHOT_EVERY:
            self._snapshots.pop(old, None)
        elif old > 0 and old % KEYFRAME_EVERY and old in self._snapshots:
            self._snapshots[old] = self._lean(old)

    def _lean(self, tokens: int) -> dict:
        """The snapshot after `tokens` tokens with each KDA S left to its frame's record to recompute (the
        conv tails kept), where that frame's states are recomputed rather than kept."""
        records = {r.layer: r for r in self._frames[tokens - 1].kda}
        out = {}
        for i, c in self._snapshots[tokens].items():
            r = records.get(i)
            step = getattr(r, "_step", None)
            out[i] = LeanKDAState(c.conv, r) if isinstance(c, KDAState) and step is not None and step.state is None else c
        return out

    @torch.no_grad()
    def _restore(self, tokens: int) -> None:
        """Set both caches to their state after `tokens` tokens of the timeline (a prefix of the live ones)."""
        self._cache, self._twin_cache = self.caches_at(tokens)
        self._snapshots = {p: s for p, s in self._snapshots.items() if p <= tokens}
        self._twin_tails.forget_after(tokens), self._own_tails.forget_after(tokens)

    @torch.no_grad()
    def caches_at(self, tokens: int) -> tuple[ModelCache, ModelCache]:
        """New (hybrid, twin) caches as they were after `tokens` tokens of the timeline; the live ones stay."""
        if not isinstance(tokens, int) or not 0 <= tokens <= len(self._frames):
            raise ValueError(f"caches_at: tokens must be a whole number from 0 to {len(self._frames)} (the timeline's frames), got {tokens!r}.")
        ids = [f.input_id for f in self._frames[:tokens]]      # the twin: its cut KV cache and kept tails (twin_tails)
        twin = self._twin_tails.cache_at(self._twin_cache, tokens, ids)
        if self._own_tails.active:                     # this model is a twin itself (--preset small-twin)
            return self._own_tails.cache_at(self._cache, tokens, ids), twin
        base = max((p for p in self._snapshots if p <= tokens), default=0)
        cache = ModelCache(self.config.num_layers)
        for i, c in enumerate(self._cache.layers):
            if base == 0 or c is None:
                continue
            cache.layers[i] = c.truncate(base) if isinstance(c, MLACache) else self._snapshots[base][i].clone()
        cache.position = base
        for f in self._frames[base:tokens]:            # replay the recorded tokens: same inputs, same state
            _, cache = self.model(torch.tensor([[f.input_id]], device=self.device), cache)
        return cache, twin

    def _branch(self, choice: Choice) -> None:
        """Make `choice` for the cursor's frame: drop the frames after it and restore the decode state."""
        c = self.cursor
        if c + 1 < len(self._frames):
            del self._frames[c + 1:], self._logits[c + 1:]
            self._restore(c + 1)
        old = self._frames[c]
        token = choose_token(self._logits[c], old.position, choice)
        self._frames[c] = dataclasses.replace(old, token_id=token, token_text=self.tokenizer.token_text(token),
                                              **choice.frame_fields())
        self.prompt_len = min(self.prompt_len, c + 1)
