"""A tiny synthetic checkpoint in the released K3 layout: the released format tried without its 1.56 TB.

`python -m sim real DIR --synthetic` writes one into an empty or missing DIR and streams it; lesson 6 and the
tests (tests/test_released_stream.py, tests/test_real_*.py) build theirs with the same function, so what a
learner tries at the command line is exactly what the end-to-end tests check.

The release is a K3-shaped TinyK3 ("tiny", 4 layers: 3 KDA + 1 MLA, 56 experts of which 4 are chosen) with every
vector (norms, depth queries, A_log, dt_bias, gains) and the selection bias perturbed off its init, so that a
tensor read into the wrong place changes the output; its routed experts are rounded to MXFP4 first, so the model
and the stream over the folder compute with the same numbers. tiny_k3.released.write_checkpoint writes it: the
released names and dtypes, MXFP4-packed experts with E8M0 scales, one shard per layer, the index json and a
config.json that is the released file with its shape fields replaced. A marker file, synthetic.json, says the
folder is synthetic, so a later `--synthetic` on the same folder streams it again instead of refusing it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tiny_k3 import K3Config, TinyK3
from tiny_k3.released import config_json_for, mxfp4_rounded, write_checkpoint

MARKER = "synthetic.json"          # what tells a synthetic release from a real one (or from anything else)
WRITER = "sim.real_synthetic"


def synthetic_config(vocab_size: int = 300, num_layers: int = 4) -> K3Config:
    """The "tiny" preset in K3's layout at widths MXFP4 can pack (a multiple of its group of 32), read back
    through config.json exactly as the stream will read it. vocab_size 300 holds the 258 byte tokens."""
    if num_layers < 4 or num_layers % 4:
        raise ValueError(f"a synthetic release has a multiple of 4 layers (K3's 3 KDA + 1 MLA), got {num_layers}.")
    base = K3Config.preset("tiny", moe_intermediate=32, latent_dim=32, shared_intermediate=32, num_experts=56,
                           top_k=4, vocab_size=vocab_size, num_layers=num_layers,
                           layer_kinds=("kda", "kda", "kda", "mla") * (num_layers // 4))
    return K3Config.from_released(config_json_for(base))


def synthetic_model(vocab_size: int = 300, num_layers: int = 4, seed: int = 3) -> TinyK3:
    """The TinyK3 a synthetic release holds (see the module's docstring). The caller's random state is left as it
    was (torch.random.fork_rng): writing a release in a lesson does not change what the lesson samples next."""
    config = synthetic_config(vocab_size, num_layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyK3(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 1:                               # norms, depth queries, A_log, dt_bias, gains
                    p.add_(0.3 * torch.randn_like(p))
            for moe in model.moe_layers():
                moe.router.bias.copy_(0.05 * torch.randn_like(moe.router.bias))
    mxfp4_rounded(model)
    return model


def write_synthetic_release(folder, vocab_size: int = 300, seed: int = 3,
                            num_layers: int = 4) -> tuple[K3Config, TinyK3, Path]:
    """(config, model, folder): `synthetic_model` written to `folder` in the released layout, with the marker.
    The model is returned too, so a test can compare the stream with the TinyK3 it was written from."""
    model = synthetic_model(vocab_size, num_layers, seed)
    folder = write_checkpoint(model, folder)
    marker = {"written_by": WRITER, "vocab_size": vocab_size, "num_layers": num_layers, "seed": seed,
              "note": "a tiny synthetic model in the released K3 layout (random weights, not K3's)"}
    (folder / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    return model.config, model, folder


def is_synthetic_release(folder) -> bool:
    """Whether `folder` holds a release written by write_synthetic_release (its marker names this module)."""
    try:
        return json.loads((Path(folder) / MARKER).read_text()).get("written_by") == WRITER
    except (OSError, ValueError, AttributeError):
        return False


def prepare_synthetic(folder) -> tuple[Path, bool]:
    """(folder, written) for `python -m sim real DIR --synthetic`: a missing or empty DIR gets a new synthetic
    release (written True); one that already holds a synthetic release is streamed again as it is (False), so
    the command can be repeated. Anything else is refused in one sentence: --synthetic never writes into a
    folder that holds other files, least of all a real checkpoint."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file; --synthetic needs an empty or new folder to write the release into.")
    if folder.is_dir() and any(folder.iterdir()):
        if is_synthetic_release(folder):
            return folder, False
        raise ValueError(f"{folder} is not empty and holds no synthetic release (no {MARKER}); give --synthetic an "
                         f"empty or new folder, or drop --synthetic to stream the checkpoint in it.")
    write_synthetic_release(folder)
    return folder, True
