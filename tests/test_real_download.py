"""`sim real --download LAYERS` and `--layers N` without the network (sim/real_download.py, sim/real.py).

The shard selection is checked on the committed table of the real index (tiny_k3/released/k3_index_table.json);
the download itself with a fake fetch that copies from a synthetic release and logs what it was asked for;
a truncated stream against a TinyK3 built from the same first layers and head.
"""

import json
import shutil
from collections import namedtuple

import numpy as np
import pytest
import torch

from sim import real_download
from sim.__main__ import main
from sim.real import Checkpoint, RealSimulation, truncated
from sim.real_download import DEFAULT_REPO, download, parse_layers, shard_sizes, shards_for
from sim.real_synthetic import write_synthetic_release
from tiny_k3 import K3Config, TinyK3
from tiny_k3.released import RELEASED_CONFIG, expand_table, layer_of, load_k3_table


def k3_weight_map() -> dict[str, str]:
    """The real index's weight_map rebuilt from the committed table: every name, in the shard the table gives
    its layer (or the top-level / vision shard)."""
    table = load_k3_table()
    shards = table["shards"]

    def shard(name):
        layer = layer_of(name)
        return shards[f"layer {layer}" if layer >= 0 else name.split(".")[0]][0]
    return {name: shard(name) for name in expand_table(table)}


def test_layers_0_to_3_of_k3_need_four_layer_shards_and_the_top_level_one_of_96():
    wm = k3_weight_map()
    table = load_k3_table()
    assert len(wm) == table["num_tensors"] == 497_220 and len(set(wm.values())) == 96
    chosen = shards_for(wm, [0, 1, 2, 3])
    assert chosen == [f"model-{i:05d}-of-000096.safetensors" for i in (1, 2, 3, 4, 94)]
    assert "model-00095-of-000096.safetensors" not in shards_for(wm, list(range(93)))   # never the vision shards
    assert len(shards_for(wm, list(range(93)))) == 94
    sizes = shard_sizes(wm, json.loads(RELEASED_CONFIG.read_text()))
    assert sum(sizes.values()) == table["total_size"]                   # every byte of the index accounted for
    assert sizes["model-00002-of-000096.safetensors"] > 896 * 17_547_264     # an MoE layer: its 896 experts and more


def test_parse_layers_and_its_errors():
    assert parse_layers("0-3", 93) == [0, 1, 2, 3]
    assert parse_layers("5", 93) == [5] and parse_layers("0,2,4-6", 93) == [0, 2, 4, 5, 6]
    with pytest.raises(ValueError, match="give layers as a range like 0-3"):
        parse_layers("3-0", 93)
    with pytest.raises(ValueError, match="layer 93 does not exist; this checkpoint has layers 0 to 92"):
        parse_layers("90-93", 93)


@pytest.fixture(scope="module")
def release8(tmp_path_factory):
    return write_synthetic_release(tmp_path_factory.mktemp("release8"), num_layers=8, seed=7)


class FakeHub:
    """fetch(repo, filename, folder): copies from a local release, logging each request; no network."""

    def __init__(self, source):
        self.source, self.asked = source, []

    def __call__(self, repo, filename, folder):
        self.asked.append((repo, filename))
        src = self.source / filename
        if not src.is_file():
            raise FileNotFoundError(filename)
        shutil.copy(src, folder / filename)
        return folder / filename


def test_download_fetches_only_the_shards_of_the_named_layers(release8, tmp_path):
    _, _, source = release8
    hub = FakeHub(source)
    said = []
    assert download(tmp_path / "dl", "0-3", fetch=hub, say=said.append) == [0, 1, 2, 3]
    files = [f for _, f in hub.asked]
    assert files[:2] == ["config.json", "model.safetensors.index.json"]
    shards = sorted(f for f in files if f.endswith(".safetensors"))
    assert shards == [f"model-{i:05d}-of-00009.safetensors" for i in (1, 2, 3, 4, 9)]    # layers 0-3 + the head's
    assert {r for r, _ in hub.asked} == {DEFAULT_REPO}
    assert any("no tiktoken.model" in s for s in said) and any("5 shards" in s for s in said)


def test_a_short_disk_is_said_before_any_shard(release8, tmp_path, monkeypatch):
    _, _, source = release8
    hub = FakeHub(source)
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(real_download.shutil, "disk_usage", lambda _: Usage(10**6, 0, 1000))
    with pytest.raises(OSError, match=r"layers 0-3 need 5 shards, .* GB still to download, and .* has 0.0 GB free"):
        download(tmp_path / "dl", "0-3", fetch=hub, say=lambda _: None)
    assert not any(f.endswith(".safetensors") for _, f in hub.asked)


def test_download_then_stream_the_truncated_model_through_the_command(release8, tmp_path, monkeypatch):
    from rich.console import Console

    _, _, source = release8
    hub = FakeHub(source)
    monkeypatch.setattr(real_download, "hf_fetch", hub)
    console = Console(record=True, width=200)
    dest = tmp_path / "dl"
    assert main(["real", str(dest), "--download", "0-3", "--prompt", "ab", "--tokens", "1"], console) == 0
    out = console.export_text()
    assert "truncated model: the first 4 of 8 layers" in out and "not the checkpoint's own" in out
    assert not (dest / "model-00005-of-00009.safetensors").exists()
    console = Console(record=True, width=200)
    assert main(["real", str(dest), "--prompt", "ab"], console) == 2          # the whole model needs all shards
    assert "4 of the 9 shards this run reads" in console.export_text()


def test_a_truncated_stream_is_tinyk3_of_the_first_layers_and_the_head(release8):
    config, model, folder = release8
    short = truncated(config, 4)
    ref = TinyK3(short).eval()
    keep = {k: v for k, v in model.state_dict().items() if not k.startswith("blocks.") or int(k.split(".")[1]) < 4}
    ref.load_state_dict(keep)
    real = RealSimulation(Checkpoint(folder, layers=4), "ab=")
    tokens = torch.tensor([[f.input_id for f in real.frames]])
    with torch.no_grad():
        logits, _ = ref(tokens)
    np.testing.assert_allclose(np.stack(real._logits), logits[0, :, :real.tokenizer.num_tokens].numpy(), atol=1e-5,
                               rtol=0)
    assert real.checkpoint.is_truncated and len(real.frames[0].routing) == len(short.moe_layers) == 3
    assert all(layer_of(n) < 4 for _, n, _ in real.checkpoint.reads)


def test_layers_must_end_on_an_mla_layer():
    with pytest.raises(ValueError, match=r"--layers 3: .* ends on an MLA layer; allowed: 4, 8, \.\.\., 92, 93\."):
        truncated(K3Config.preset("k3"), 3)
    assert truncated(K3Config.preset("k3"), 8).num_layers == 8


def test_no_gpu_for_device_cuda_is_one_line_before_any_work(release8, tmp_path):
    from rich.console import Console

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    console = Console(record=True, width=200)
    assert main(["real", str(tmp_path / "nowhere"), "--device", "cuda"], console) == 2
    out = console.export_text()
    assert "device 'cuda' was asked for but no CUDA GPU is available" in out and "not a folder" not in out


def test_a_run_file_the_disk_cannot_hold_is_said_before_the_first_token(release8, tmp_path, monkeypatch):
    import sim.real as real_module
    import sim.real_needs as real_needs
    from rich.console import Console

    from sim import runfile
    config, _, folder = release8
    sim = RealSimulation(folder, "ab")
    path = runfile.save(sim, tmp_path / "one.npz")
    stored = sum(a.nbytes for a in runfile.read(path).arrays.values()) / len(sim.frames)
    assert real_needs.frame_file_bytes(config) <= stored <= 1.5 * real_needs.frame_file_bytes(config)
    k3 = real_needs.frame_file_bytes(K3Config.preset("k3"))
    assert 69 * 96 * 128 * 128 * 2 < k3 < 1.05 * 69 * 96 * 128 * 128 * 2    # a real K3 frame: mostly its KDA states
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(10**6, 0, 1000))
    calls = []
    monkeypatch.setattr(real_module, "RealSimulation", lambda *a, **k: calls.append(1))
    console = Console(record=True, width=200)
    assert main(["real", str(folder), "--save", str(tmp_path / "big.npz"), "--tokens", "3"], console) == 2
    out = console.export_text()
    assert "--save" in out and "GB free" in out and not calls
