"""Shipped checkpoints: safetensors files in tiny_k3/weights/, checked before use. Nothing is unpickled."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

from .config import ConfigError, K3Config

WEIGHTS_DIR = Path(__file__).parent / "weights"


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt or does not fit its preset; one sentence says which."""


def weights_path(preset: str, directory: Path = WEIGHTS_DIR) -> Path:
    return Path(directory) / f"{preset.replace('/', '_')}.safetensors"


def checkpoint_names() -> list[str]:
    """Every name a checkpoint may have: each preset and its all-softmax twin ("small-twin")."""
    return [n for name in K3Config.presets() for n in (name, f"{name}-twin")]


def config_for(name: str) -> K3Config:
    """The config of a checkpoint name: a preset, or "<preset>-twin" for its all-MLA twin."""
    if name.endswith("-twin") and name[:-len("-twin")] in K3Config.presets():
        return K3Config.preset(name[:-len("-twin")]).twin()
    return K3Config.preset(name)


def available_pretrained(directory: Path = WEIGHTS_DIR) -> list[str]:
    """Checkpoint names (presets and "<preset>-twin") whose trained weights ship with the package."""
    return [name for name in checkpoint_names() if weights_path(name, directory).exists()]


def config_to_json(config: K3Config) -> str:
    return json.dumps(dataclasses.asdict(config), sort_keys=True)


def stored_state(model, dtype: torch.dtype | None = torch.bfloat16) -> dict[str, torch.Tensor]:
    """The state dict as a checkpoint stores it: matrices in `dtype`, vectors (norms, depth queries, gates,
    router biases) in float32, anything not floating as it is; dtype=None keeps every tensor as it is.

    The vectors are a few kB, and a router bias moves in steps of gamma = 1e-3 that bfloat16 would round
    away (flipping expert choices).
    """
    def store(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().contiguous().cpu()
        if dtype is None or not t.is_floating_point():
            return t
        return t.to(dtype) if t.dim() >= 2 else t.float()
    return {name: store(t) for name, t in model.state_dict().items()}


def save_pretrained(model, path: str | Path, info: dict | None = None, dtype: torch.dtype | None = None) -> Path:
    """Write model weights (+ its config in the metadata) as safetensors, and `info` beside it as JSON.

    `dtype` (e.g. torch.bfloat16) stores the matrices narrower, as `stored_state` says.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(stored_state(model, dtype), str(path), metadata={"config": config_to_json(model.config)})
    if info is not None:
        path.with_suffix(".json").write_text(json.dumps(info, indent=2) + "\n")
    return path


def stored_config(meta: dict) -> K3Config | None:
    """The config a checkpoint's metadata names (fields added since it was written take their defaults)."""
    try:
        return K3Config(**json.loads(meta["config"]))
    except (KeyError, TypeError, ValueError):
        return None


def load_pretrained(model_cls, preset: str, device=None, directory: Path = WEIGHTS_DIR):
    """Build `model_cls(config)` for a preset and load its shipped weights, checking everything first."""
    config = config_for(preset)
    path = weights_path(preset, directory)
    if not path.exists():
        shipped = ", ".join(available_pretrained(directory)) or "none"
        raise CheckpointError(f"no trained weights ship for preset {preset!r}; presets with weights: {shipped}.")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint {path.name} is corrupt or unreadable ({type(exc).__name__}).") from None
    if stored_config(meta) != config:
        raise CheckpointError(f"checkpoint {path.name} was trained for a different config than preset {preset!r}.")

    model = model_cls(config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        name = (missing or unexpected)[0]
        raise CheckpointError(f"checkpoint {path.name} does not match the model: "
                              f"{'missing' if missing else 'unexpected'} tensor {name!r}.")
    for name, tensor in tensors.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(f"checkpoint {path.name}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                                  f"the model expects {tuple(expected[name].shape)}.")
        if not torch.isfinite(tensor.float()).all():
            raise CheckpointError(f"checkpoint {path.name}: tensor {name!r} holds non-finite values.")
    model.load_state_dict(tensors)  # copies (and casts bfloat16 files) into the config's dtype
    return model.to(device) if device is not None else model


__all__ = ["CheckpointError", "ConfigError", "save_pretrained", "stored_state", "stored_config", "load_pretrained", "available_pretrained",
           "weights_path", "config_for", "checkpoint_names"]
