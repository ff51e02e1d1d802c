"""What a run of a released checkpoint needs (sim/real.py): bytes per token and per layer, free RAM, and disk for
a run file, each checked before the first token with one clear error."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from tiny_k3.config import K3Config
from tiny_k3.released import LM, expert_tensors, released_tensors, spec_bytes

from .measure.measurement import available_bytes


def layer_bytes(config: K3Config) -> dict:
    """Bytes of the released layout: per token read (non-expert weights of every layer, the head, one embedding
    row, and top_k experts per MoE layer), the largest layer's non-expert part, one expert, the whole checkpoint."""
    specs = released_tensors(config, experts=False)
    expert = sum(spec_bytes(s) for s in expert_tensors(config, config.moe_layers[0], 0).values())
    layers = {}
    for n, s in specs.items():
        key = n.split(".")[3] if ".layers." in n else n
        layers[key] = layers.get(key, 0) + spec_bytes(s)
    embed = specs[LM + "model.embed_tokens.weight"]
    row = spec_bytes(embed) // embed.shape[0]
    non_expert = sum(layers.values()) - spec_bytes(embed)
    return {"expert": expert, "experts_per_token": expert * config.top_k * len(config.moe_layers),
            "non_expert_per_token": non_expert + row, "largest_layer": max(v for k, v in layers.items() if k.isdigit()),
            "head": spec_bytes(specs[LM + "lm_head.weight"]),
            "total": sum(spec_bytes(s) for s in specs.values()) + expert * config.num_experts * len(config.moe_layers)}


def check_ram(checkpoint, keep: bool) -> None:
    """A clear error before the first token when this machine's free RAM cannot hold what a token needs, in the
    compute dtype: the largest layer's non-expert weights (every layer's with keep), the head and top_k decoded
    experts."""
    cfg, size = checkpoint.config, checkpoint.compute_dtype.itemsize
    per_layer: dict[str, int] = {}
    for n, s in checkpoint.specs.items():
        if ".layers." in n and ".experts." not in n:
            per_layer[n.split(".")[3]] = per_layer.get(n.split(".")[3], 0) + math.prod(s.shape)
    layers = sum(per_layer.values()) if keep else max(per_layer.values())
    head = math.prod(checkpoint.specs[LM + "lm_head.weight"].shape)
    experts = cfg.top_k * 3 * cfg.moe_intermediate * cfg.latent_dim
    need = (layers + head + experts) * size
    have = available_ram()
    if have is not None and need > have:
        what = "every layer" if keep else "the largest layer"
        dtype = str(checkpoint.compute_dtype).removeprefix("torch.")
        raise MemoryError(f"this run needs about {need / 2**30:.1f} GiB of free RAM ({what}, the head and "
                          f"{cfg.top_k} decoded experts in {dtype}), and {have / 2**30:.1f} GiB is available.")


def frame_file_bytes(config: K3Config) -> int:
    """Bytes one frame takes in a run file (sim.runfile's arrays), from the config: per KDA layer the float16
    state [H, K, V], the decay [H, K] and three [H] vectors; per MoE layer the scores and bias [E] and the k ids
    and weights; a little more for the depth reads, sublayers, memory and top-5 (a lower bound within 1%)."""
    H, K, E, k = config.kda_heads, config.kda_head_dim, config.num_experts, config.top_k
    kda = len(config.kda_layers) * (H * K * K * 2 + H * K * 4 + 3 * H * 4)
    routing = len(config.moe_layers) * (2 * E * 4 + k * (8 + 4))
    return kda + routing


def check_save_disk(config: K3Config, frames: int, path) -> None:
    """A clear error before the first token when the disk under `path` cannot hold a run file of `frames`."""
    import shutil

    folder = Path(path).resolve().parent
    need = frames * frame_file_bytes(config)
    free = shutil.disk_usage(folder if folder.is_dir() else Path.cwd()).free
    if need > free:
        raise OSError(f"--save {path}: {frames} frames of this model take about {need / 1e9:.1f} GB "
                      f"({frame_file_bytes(config) / 1e6:.0f} MB a frame, mostly KDA states), and {folder} has "
                      f"{free / 1e9:.1f} GB free; save fewer tokens or elsewhere.")


def available_ram() -> int:
    """Free RAM here (the OS's MemAvailable): what the streamed weights are read into."""
    return available_bytes(torch.device("cpu"))
