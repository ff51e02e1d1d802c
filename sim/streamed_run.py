"""Reopening a saved run: a live Simulation again, or, for a run streamed from a released checkpoint, a read-only one.

    sim.load("run.npz")          # = open_run: Simulation.from_run, or a StreamedRun for a released run

sim/runfile.py is the format and imports no Simulation; sim/session.py's `Simulation.from_run` replays a run
made by a preset. A run streamed from a released checkpoint (sim/real.py) cannot be replayed without its
weights, so it opens here as a `StreamedRun`: every recorded Frame can be looked at, nothing recomputed.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tiny_k3.tokenizer import BYTES

from .frame import Frame
from .runfile import SavedRun, config_from_dict, is_released, read, stored_tokenizer
from .session import Simulation


def open_run(path, *, device: str | None = "cpu", progress=None) -> Simulation:
    """Reopen the run saved at `path` at its saved cursor: a live Simulation (Simulation.from_run), or a read-only
    StreamedRun when it was streamed from a released checkpoint. progress(done, total) as frames are recomputed."""
    run = read(path)
    if is_released(run):
        return StreamedRun(run, Path(path).name)
    return Simulation.from_run(path, device=device, progress=progress, run=run)


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
