"""What a front end can run: the presets, their configs and defaults, and the device check.

The TUI (tui_app/) reads the model's catalogue through this module only, so it imports nothing from
tiny_k3 itself: a preset is a name here and a K3Config on the Simulation.
"""

from __future__ import annotations

from tiny_k3.config import COUNTED_ONLY, DEFAULT_PRESET, DEFAULT_PROMPT, K3Config
from tiny_k3.model import resolve_device
from tiny_k3.weights import CheckpointError, available_pretrained, config_for

__all__ = ["COUNTED_ONLY", "DEFAULT_PRESET", "DEFAULT_PROMPT", "CheckpointError", "K3Config", "check_device",
           "config_for", "has_checkpoint", "sim_preset", "tui_presets"]


def tui_presets() -> list[str]:
    """The presets a front end runs: every runnable preset, then each shipped all-softmax twin checkpoint
    ("small-twin": `small` with every attention layer MLA, trained on the same data)."""
    twins = [name for name in available_pretrained() if name.endswith("-twin")]
    return K3Config.runnable_presets() + twins


def sim_preset(name: str) -> str | K3Config:
    """What Simulation is given for a front end's preset: the name itself, or a twin checkpoint's config
    (Simulation takes preset names only; load_model finds the twin's shipped weights from the config)."""
    return name if name in K3Config.presets() else config_for(name)


def has_checkpoint(name: str) -> bool:
    """A trained checkpoint of this preset ships with the package."""
    return name in available_pretrained()


def check_device(device: str | None) -> None:
    """One ValueError naming a device that cannot run (unknown, or CUDA without a GPU); None is the default."""
    resolve_device(device)
