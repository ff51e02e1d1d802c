"""The TUI's driver: owns the Simulation, the cursor and the work queue. Plain Python, no Textual.

The app calls the cheap methods on its UI thread (`next`, `back`, `goto`, `begin_load`, `start_step`,
`request_what_if`) and runs the jobs they hand out in worker threads: `run_load` (build a Simulation, the
prompt prefilled token by token with progress, checking a cancel flag between tokens), `run_step` (one
`Simulation.step()`), `run_what_if` (`Simulation.what_if` at the cursor's frame, the cancel flag checked
between its tokens) and `run_recall` (`Simulation.recall_moment` at a recall query, once per frame).
Results come back to the UI thread through `finish_load` / `finish_step` / `finish_what_if` /
`finish_recall`, which drop anything stale (a job of a session that has since been replaced or cancelled).
One job touches a Simulation at a time (`busy`): a Simulation is not thread-safe.

Cursor rules:
  * `step` is the frame on screen; `visited` the furthest the learner has seen; frames up to
    `visited + lookahead` are computed ahead so `n` needs no compute while the learner reads.
  * Held keys do not queue: `n` past the computed frames sets one goal, "go to step len(frames)", and
    further presses while that frame computes coalesce into the same goal (issue 13: 350 presses once
    kept stepping for two minutes). The cursor jumps there when the frame arrives.
  * The Simulation's own cursor stays on its last frame, so `sim.step()` always extends the timeline.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from sim import Simulation
from sim.streamed_run import open_run
from sim.whatif import WhatIfPlan
from sim.recall_moment import find_query, still_carried
from sim.presets import CheckpointError, has_checkpoint, sim_preset
from sim.runfile import RELEASED

from .runs import read_only_note

REPO = Path(__file__).resolve().parents[1]   # the checkout (dev.py beside tui.py), when run from one
PROGRESS_EVERY = 0.1   # seconds between progress reports: often enough for a smooth bar, rarely enough to be free
ETA_AFTER = 4          # tokens timed after the first one before a load's progress line estimates the time left
WHAT_IF_STEPS = 8      # a what-if recomputes the cursor's frame and 7 more tokens (fewer where the context ends)


def in_checkout() -> bool:
    return (REPO / "dev.py").exists() and (REPO / "tui.py").exists()


def runs_dir() -> Path:
    """Where `s` saves runs: runs/ of the checkout (git-ignored), else runs/ in the working directory."""
    return (REPO if in_checkout() else Path.cwd()) / "runs"


def save_note(path: Path, step: int) -> str:
    """The line after a save: where the run went and the command that reopens it, as the user types it
    from the checkout (`python3 dev.py run --open runs/FILE`; dev.py runs the TUI from there), or with the
    installed `tiny-k3` outside one."""
    path = Path(path).resolve()
    if not in_checkout():
        return f"saved at step {step} to {path}; reopen with: tiny-k3 --open {path}"
    try:
        shown = path.relative_to(REPO)
    except ValueError:
        shown = path
    ignored = " (runs/ is git-ignored)" if shown.parts[:1] == ("runs",) else ""
    return f"saved at step {step} to {shown}{ignored}; reopen with: python3 dev.py run --open {shown}"


@dataclass(frozen=True)
class RunSpec:
    """What to load: a preset and prompt, or a saved run (`open_path`)."""

    preset: str
    prompt: str
    seed: int = 0
    weights: str = "auto"         # "auto": the shipped trained weights where the preset has them
    device: str | None = None
    open_path: str | None = None

    def expected_weights(self) -> str:
        """What a load of this spec will most likely use, for the loading line (before anything is built)."""
        if self.open_path is not None:
            return f"saved run {self.open_path}"
        shipped = has_checkpoint(self.preset)
        return "trained checkpoint" if self.weights != "random" and shipped else f"random init, seed {self.seed}"


@dataclass(frozen=True)
class Progress:
    """Prefill progress of one load: frames done of total, and the seconds it has taken so far.

    `seconds` includes building the model (a minute on k3-topo), so the time left is estimated only from the
    tokens timed after the first one came out: `timed` tokens in `timed_seconds`, at least ETA_AFTER of them."""

    done: int
    total: int
    seconds: float
    timed: int = 0                  # tokens done since the first token came out
    timed_seconds: float = 0.0      # ... and the seconds they took

    @property
    def tokens_per_s(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    @property
    def rate(self) -> float | None:
        """Tokens per second of the timed tokens; None until ETA_AFTER of them have been timed."""
        if self.timed < ETA_AFTER or self.timed_seconds <= 0:
            return None
        return self.timed / self.timed_seconds

    @property
    def seconds_left(self) -> float | None:
        """The estimated seconds to the last token; None while there is no rate yet (or nothing is left)."""
        rate = self.rate
        return None if rate is None or self.done >= self.total else (self.total - self.done) / rate


@dataclass(frozen=True)
class Loaded:
    """A built session, handed from the load worker to the UI thread."""

    sim: Simulation
    spec: RunSpec                 # as loaded (for a saved run: its preset, prompt and seed)
    weights: str                  # what is really loaded, e.g. "trained checkpoint small.safetensors"
    step: int                     # where the cursor starts


class Cancelled(Exception):
    """Raised inside a job when its cancel flag was set; the job stops between two tokens."""


class CancelFlag:
    """Set by the UI thread, checked by the worker between tokens; `observed` records that it stopped."""

    def __init__(self) -> None:
        self._set = threading.Event()
        self.observed = threading.Event()

    def set(self) -> None:
        self._set.set()

    @property
    def is_set(self) -> bool:
        return self._set.is_set()

    def check(self) -> None:
        if self._set.is_set():
            self.observed.set()
            raise Cancelled


@dataclass(frozen=True)
class LoadTicket:
    """One load request; the newest is the only one whose result is installed."""

    spec: RunSpec
    flag: CancelFlag


@dataclass(frozen=True)
class WhatIfJob:
    """One what-if request: `changes` (checked) at timeline frame `step`, for `steps` tokens; only the newest
    request's result is shown."""

    sim: Simulation
    step: int
    changes: tuple
    steps: int
    flag: CancelFlag
    plan: WhatIfPlan | None = None      # the changes checked and turned into hooks, once


def weights_label(sim: Simulation, fallback: str | None = None) -> str:
    """The status line's account of the weights actually in the model."""
    if getattr(sim, "read_only_reason", None):      # a run streamed from a released checkpoint (sim.runfile)
        # its weights label is "released <folder>"; the preset shown beside it is "released" already
        return f"streamed from {sim.weights.removeprefix(RELEASED).strip() or 'a released checkpoint'}, read-only"
    if sim.weights == "trained":
        return f"trained checkpoint {sim.config.name}.safetensors"
    label = f"random init, seed {sim.seed}"
    return f"{label} (fallback: {fallback})" if fallback else label


class Driver:
    """Owns the Simulation, the cursor (step / visited / goal) and what to compute next."""

    def __init__(self, lookahead: int = 2, make_sim: Callable[..., Simulation] = Simulation,
                 open_run: Callable[..., Simulation] = open_run, clock: Callable[[], float] = time.perf_counter):
        self.lookahead = lookahead
        self._make_sim, self._open_run, self._clock = make_sim, open_run, clock
        self.sim: Simulation | None = None
        self.spec: RunSpec | None = None        # what is loaded
        self.weights = ""                       # weights_label of what is loaded
        self.loading: LoadTicket | None = None  # what is being loaded
        self.progress: Progress | None = None
        self.step = self.visited = self.goal = 0
        self.end_reason: str | None = None      # why the timeline cannot grow (context full, a step failed)
        self.stepping = False                   # a step job is in flight (one at a time: sims are not thread-safe)
        self._step_flag = CancelFlag()
        self.whatif: WhatIfJob | None = None    # the what-if asked for (waiting or running), until it is shown
        self.whatif_running: WhatIfJob | None = None   # the what-if job whose worker has not returned yet
        self.whatif_progress: Progress | None = None
        self.recalling: int | None = None       # the frame whose recall moment a worker computes
        self._recalls: dict[int, object] = {}   # frame -> RecallMoment (or None: not a query / failed)
        self._queries: dict[int, bool] = {}     # frame -> its input is a recall query's "="

    # ------------------------------------------------------------------ loading
    def begin_load(self, spec: RunSpec) -> LoadTicket:
        """A new load; it cancels the one in flight (a new prompt or preset replaces the old load)."""
        self.cancel_load()
        self.loading = LoadTicket(spec, CancelFlag())
        self.progress = None
        return self.loading

    def cancel_load(self) -> bool:
        """Stop the load in flight (Esc); the session on screen stays. False when nothing was loading."""
        if self.loading is None:
            return False
        self.loading.flag.set()
        self.loading, self.progress = None, None
        return True

    def cancel_all(self) -> None:
        """Quitting: every job stops at its next check."""
        self.cancel_load()
        self.cancel_what_if()
        self._step_flag.set()

    @property
    def busy(self) -> bool:
        """A job is working on the Simulation now (only one at a time)."""
        return self.stepping or self.whatif_running is not None or self.recalling is not None

    def run_load(self, ticket: LoadTicket, report: Callable[[Progress], None] | None = None) -> Loaded:
        """[worker thread] Build the session of `ticket`: raises Cancelled, or ValueError with one sentence."""
        spec, flag = ticket.spec, ticket.flag
        start = self._clock()
        last = [start]
        first: list[tuple[int, float]] = []     # (done, time) when the first token came out: the model is built

        def progress(done: int, total: int) -> None:
            flag.check()
            now = self._clock()
            if not first:
                first.append((done, now))
            if report is not None and (done == total or now - last[0] >= PROGRESS_EVERY):
                last[0] = now
                report(Progress(done, total, now - start, done - first[0][0], now - first[0][1]))

        flag.check()
        if spec.open_path is not None:
            sim = self._open_run(spec.open_path, device=spec.device, progress=progress)
            flag.check()
            opened = replace(spec, preset=sim.config.name, prompt=sim.prompt, seed=sim.seed, weights=sim.weights)
            return Loaded(sim, opened, weights_label(sim), sim.cursor)
        fallback = None
        try:
            sim = self._make_sim(sim_preset(spec.preset), spec.prompt, seed=spec.seed, device=spec.device,
                                 weights=spec.weights, progress=progress)
        except CheckpointError as exc:
            if spec.weights != "auto":
                raise
            # "auto" means the trained weights where they ship; an unreadable checkpoint must not leave the
            # learner with nothing, so run random init and say so (DESIGN.md: bad input loses nothing)
            fallback = str(exc).rstrip(".")
            flag.check()
            sim = self._make_sim(sim_preset(spec.preset), spec.prompt, seed=spec.seed, device=spec.device,
                                 weights="random", progress=progress)
        flag.check()
        return Loaded(sim, spec, weights_label(sim, fallback), len(sim.frames) - 1)

    def finish_load(self, ticket: LoadTicket, loaded: Loaded) -> bool:
        """[UI thread] Install a finished load; False (and nothing changes) when it is stale."""
        if ticket is not self.loading:
            return False
        self.loading, self.progress = None, None
        self._step_flag.set()                   # a step of the old session may still run: its result is dropped
        self._step_flag = CancelFlag()
        self.cancel_what_if()                   # a what-if of the old session is never shown
        self.sim, self.spec, self.weights = loaded.sim, loaded.spec, loaded.weights
        self.stepping, self.whatif_running, self.recalling = False, None, None   # old jobs touch the old sim
        self._recalls, self._queries = {}, {}
        last = len(loaded.sim.frames) - 1
        loaded.sim.goto(last)                   # the sim's cursor stays at the end; ours is `step`
        self.step = self.goal = loaded.step
        # the whole prompt counts as seen: a run saved inside its prompt reopens with the prompt's tail shown
        self.visited = min(max(loaded.step, loaded.sim.prompt_len - 1), last)
        self.end_reason = read_only_note(loaded.sim)   # a read-only run never grows
        return True

    def fail_load(self, ticket: LoadTicket) -> bool:
        """[UI thread] A load failed; True when it was the current one (then say so)."""
        if ticket is not self.loading:
            return False
        self.loading, self.progress = None, None
        return True

    def report(self, ticket: LoadTicket, progress: Progress) -> bool:
        if ticket is not self.loading:
            return False
        self.progress = progress
        return True

    # ------------------------------------------------------------------ the cursor
    @property
    def frames(self) -> list:
        return [] if self.sim is None else self.sim.frames

    def next(self) -> str:
        """`n`: "moved" (shown at once), "waiting" (the frame is being computed) or "end" (see end_reason)."""
        frames = self.frames
        if not frames:
            return "end"
        if self.step + 1 < len(frames):
            self.step += 1
            self.goal = max(self.goal, self.step)
            self.visited = max(self.visited, self.step)
            return "moved"
        if self.at_end:
            return "end"
        self.goal = len(frames)                 # coalesced: every press until it arrives asks for this step
        return "waiting"

    def back(self) -> bool:
        if self.step == 0:
            return False
        self.step -= 1
        self.goal = self.step
        return True

    def goto(self, i: int) -> bool:
        if not 0 <= i < len(self.frames):
            return False
        self.step = self.goal = i
        self.visited = max(self.visited, i)
        return True

    @property
    def at_end(self) -> bool:
        """The timeline cannot grow: the preset's context is full or a step failed."""
        if self.end_reason is None and self.sim is not None and len(self.frames) >= self.sim.config.max_seq_len:
            self.end_reason = (f"the context is full: preset {self.sim.config.name!r} holds "
                               f"{self.sim.config.max_seq_len} tokens, prompt and generated; b goes back, "
                               f"e starts a new prompt")
        return self.end_reason is not None

    # ------------------------------------------------------------------ stepping
    def wants_step(self) -> bool:
        """A step job should start now: nothing in flight, no load competing for the CPU, frames wanted."""
        if self.sim is None or self.busy or self.whatif is not None or self.loading is not None or self.at_end:
            return False
        return len(self.frames) - 1 < max(self.goal, self.visited + self.lookahead)

    def start_step(self) -> tuple[Simulation, CancelFlag]:
        self.stepping = True
        return self.sim, self._step_flag

    @staticmethod
    def run_step(sim: Simulation, flag: CancelFlag):
        """[worker thread] One token on the timeline's end."""
        flag.check()
        return sim.step()

    def finish_step(self, sim: Simulation, error: str | None = None) -> bool:
        """[UI thread] A step job ended; True when the cursor moved (a coalesced goal was reached)."""
        if sim is not self.sim:
            return False
        self.stepping = False
        if error is not None:                   # "n: <why>" names what the app can still do
            self.end_reason = f"{error.rstrip('.')}; b goes back, e starts a new prompt"
            self.goal = min(self.goal, len(self.frames) - 1)
            return False
        if self.goal > self.step and self.goal < len(self.frames):
            self.step = self.goal
            self.visited = max(self.visited, self.step)
            return True
        return False

    # ------------------------------------------------------------------ what-if
    def request_what_if(self, changes, steps: int = WHAT_IF_STEPS) -> WhatIfJob:
        """[UI thread] Ask for a what-if at the cursor's frame; it replaces one not yet shown and runs once no
        other job is in flight. Raises ValueError (one sentence) for a change that does not fit the preset."""
        if self.sim is None:
            raise ValueError("nothing is loaded yet, so there is no token to change; wait for the load.")
        if read_only_note(self.sim):
            raise ValueError(read_only_note(self.sim))
        plan = WhatIfPlan.of(changes, self.sim.config)
        self.cancel_what_if()
        steps = max(1, min(steps, self.sim.config.max_seq_len - self.step))
        self.whatif = WhatIfJob(self.sim, self.step, plan.changes, steps, CancelFlag(), plan)
        self.whatif_progress = None
        return self.whatif

    def wants_what_if(self) -> bool:
        return (self.whatif is not None and self.whatif_running is None and not self.busy
                and self.loading is None)

    def start_what_if(self) -> WhatIfJob:
        self.whatif_running = self.whatif
        return self.whatif

    def run_what_if(self, job: WhatIfJob, report: Callable[[Progress], None] | None = None):
        """[worker thread] sim.what_if at the job's frame -> WhatIf; raises Cancelled between two tokens,
        or ValueError with one sentence. The timeline and the sim's cursor are untouched."""
        start = self._clock()

        def progress(done: int, total: int) -> None:
            job.flag.check()
            if report is not None:
                report(Progress(done, total, self._clock() - start))

        job.flag.check()
        return job.sim.what_if(job.plan or WhatIfPlan.of(job.changes, job.sim.config), at=job.step,
                               steps=job.steps, progress=progress)

    @staticmethod
    def run_still_carried(job: WhatIfJob, w):
        """[worker thread] After a what-if that reset some KDA states and left the next token alone: the same
        token with every KDA state reset (and each KDA layer alone) beside it, sim.recall_moment.still_carried;
        None for any other what-if. The timeline and the sim's cursor are untouched."""
        job.flag.check()
        return still_carried(job.sim, w)

    def report_what_if(self, job: WhatIfJob, progress: Progress) -> bool:
        if job is not self.whatif:
            return False
        self.whatif_progress = progress
        return True

    def finish_what_if(self, job: WhatIfJob) -> bool:
        """[UI thread] A what-if job ended (done, failed or cancelled); True when its result is the one to show."""
        if self.whatif_running is job:
            self.whatif_running = None
        if job is not self.whatif or job.flag.is_set:
            return False
        self.whatif, self.whatif_progress = None, None
        return True

    def cancel_what_if(self) -> bool:
        """Esc while a what-if computes: it stops at its next token; False when none was asked for."""
        if self.whatif is None:
            return False
        self.whatif.flag.set()
        self.whatif, self.whatif_progress = None, None
        return True

    # ------------------------------------------------------------------ the recall moment
    def is_query(self, i: int) -> bool:
        """Frame i's input is the "=" of a recall query ("| q="): cheap, remembered per frame."""
        if i not in self._queries:
            ids = [f.input_id for f in self.frames[:i + 1]]
            self._queries[i] = find_query(ids, i) is not None
        return self._queries[i]

    def recall_for(self, i: int):
        """Frame i's RecallMoment once computed; None while computing and where the input is no query."""
        return self._recalls.get(i)

    def wants_recall(self) -> bool:
        """The cursor is on a recall query whose moment is not computed yet, and nothing else runs."""
        return (self.sim is not None and not self.busy and self.loading is None and self.whatif is None
                and not read_only_note(self.sim)       # a read-only run has no model to run the moment with
                and self.step not in self._recalls and self.is_query(self.step))

    def start_recall(self) -> tuple[Simulation, int]:
        self.recalling = self.step
        return self.sim, self.step

    @staticmethod
    def run_recall(sim: Simulation, i: int):
        """[worker thread] one forward pass over the text up to frame i (about 0.1 s on small)."""
        return sim.recall_moment(i)

    def finish_recall(self, sim: Simulation, i: int, moment) -> bool:
        """[UI thread] Keep frame i's moment (None: it failed); True when the cursor is still on it."""
        if sim is not self.sim:
            return False
        self.recalling = None
        self._recalls[i] = moment
        return i == self.step

    def __repr__(self) -> str:
        name = None if self.spec is None else self.spec.preset
        return (f"Driver(preset={name!r}, step={self.step}, visited={self.visited}, goal={self.goal}, "
                f"frames={len(self.frames)}, stepping={self.stepping}, loading={self.loading is not None})")

