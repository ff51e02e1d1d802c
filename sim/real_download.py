"""`python -m sim real DIR --download LAYERS`: fetch only what a few layers of a released checkpoint need.

The release keeps each layer in one shard (layer L in shard L+1 of 96) and the embedding, head and final norms
in one more (tiny_k3/released/k3_index_table.json, "shards"). So streaming layers 0-3 needs the index, the
config, the tokenizer files, four layer shards and the top-level shard: about 57 GB of the 1.56 TB
(docs/released.md §6), which a large disk can hold where the whole checkpoint cannot.

Downloads go through huggingface_hub (`hf_hub_download`: its resumable transfers, its progress bars, its
metadata cache under DIR/.cache/huggingface) into DIR, from DEFAULT_REPO unless --repo names another. Only
this flag ever reaches the network; the tests pass a fake `fetch` (tests/test_real_download.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

from tiny_k3.config import K3Config
from tiny_k3.released import (NOT_LANGUAGE, ReleasedFormatError, config_fields_from_released, layer_of,
                              read_config_json, released_tensors, spec_bytes, vision_tensors)
from tiny_k3.tokenizer import TOKENIZER_FILES

DEFAULT_REPO = "moonshotai/Kimi-K3"     # Moonshot's release on the Hugging Face hub (docs/released.md §1)
INDEX = "model.safetensors.index.json"

Fetch = Callable[[str, str, Path], Path]   # (repo id, file name in the repo, DIR) -> the local file


def hf_fetch(repo: str, filename: str, folder: Path) -> Path:
    """One file of `repo` into `folder` through huggingface_hub (resumable, with its progress bar)."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise ValueError("--download needs the huggingface_hub package: pip install 'tiny-k3[real]'.") from None
    return Path(hf_hub_download(repo_id=repo, filename=filename, local_dir=folder))


def parse_layers(text: str, num_layers: int) -> list[int]:
    """"0-3" -> [0, 1, 2, 3]; also "5" and "0,2,4-6". Every layer must exist (0..num_layers-1)."""
    layers: set[int] = set()
    try:
        for part in str(text).split(","):
            first, _, last = part.strip().partition("-")
            a, b = int(first), int(last or first)
            if a > b:
                raise ValueError
            layers.update(range(a, b + 1))
    except ValueError:
        raise ValueError(f"--download {text!r}: give layers as a range like 0-3, a number, or a comma list "
                         f"(0,2,4-6).") from None
    bad = sorted(i for i in layers if not 0 <= i < num_layers)
    if bad:
        raise ValueError(f"--download {text!r}: layer {bad[0]} does not exist; this checkpoint has layers 0 to "
                         f"{num_layers - 1}.")
    return sorted(layers)


def shards_for(weight_map: dict[str, str], layers: list[int]) -> list[str]:
    """The shards holding the language-model tensors of `layers` and the ones outside the layers (embedding,
    head, final norms): what streaming those layers reads. Never the vision tower's."""
    wanted = set(layers) | {-1}
    return sorted({shard for name, shard in weight_map.items()
                   if not name.startswith(NOT_LANGUAGE) and layer_of(name) in wanted})


def shard_sizes(weight_map: dict[str, str], config_json: dict) -> dict[str, int]:
    """Bytes of each shard, from the shapes and dtypes of the tensors the index puts in it (the index records no
    sizes; tiny_k3.released's layout accounts for the release's total_size to the byte)."""
    whole, _ = read_config_json(config_json)
    config = K3Config(name="released", **config_fields_from_released(whole))
    specs = released_tensors(config) | vision_tensors(whole)
    sizes: dict[str, int] = {}
    for name, shard in weight_map.items():
        if name not in specs:
            raise ReleasedFormatError(f"the index names {name!r}, which is not a tensor of the released layout.")
        sizes[shard] = sizes.get(shard, 0) + spec_bytes(specs[name])
    return sizes


def download(folder, layers: str, repo: str = DEFAULT_REPO, fetch: Fetch | None = None, say=print) -> list[int]:
    """Fetch into `folder` the config, index and tokenizer files of `repo` and the shards `layers` need; a
    clear error before any shard when the disk cannot hold them. -> the layers, sorted."""
    import json

    fetch = fetch or hf_fetch                 # looked up here, so a test can stand in for the network
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config_path = fetch(repo, "config.json", folder)
    index_path = fetch(repo, INDEX, folder)
    for name in TOKENIZER_FILES:
        try:
            fetch(repo, name, folder)
        except Exception as exc:  # noqa: BLE001 - a repo without tokenizer files still streams, with byte tokens
            say(f"{repo} has no {name} ({type(exc).__name__}); --tokenizer auto will use byte tokens")
    whole = json.loads(Path(config_path).read_text())
    try:
        weight_map = json.loads(Path(index_path).read_text())["weight_map"]
    except (ValueError, KeyError) as exc:
        raise ReleasedFormatError(f"{index_path} is not a safetensors index with a weight_map ({exc}).") from None
    num_layers = whole.get("text_config", whole)["num_hidden_layers"]
    chosen = parse_layers(layers, num_layers)
    shards = shards_for(weight_map, chosen)
    sizes = shard_sizes(weight_map, whole)
    need = sum(sizes[s] for s in shards if not (folder / s).is_file())
    free = shutil.disk_usage(folder).free
    if need > free:
        raise OSError(f"layers {layers} need {len(shards)} shards, {need / 1e9:.1f} GB still to download, and "
                      f"{folder} has {free / 1e9:.1f} GB free.")
    say(f"downloading {len(shards)} shards of {repo} for layers {layers} ({need / 1e9:.1f} GB still to fetch) "
        f"into {folder}")
    for shard in shards:
        fetch(repo, shard, folder)
    return chosen
