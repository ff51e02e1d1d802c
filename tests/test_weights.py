import json

import pytest
import torch

from tiny_k3 import K3Config, TinyK3
from tiny_k3.weights import (CheckpointError, available_pretrained, config_for, load_pretrained, save_pretrained,
                             weights_path)


def _saved(tmp_path, preset="tiny", dtype=None):
    torch.manual_seed(0)
    model = TinyK3(config_for(preset))
    save_pretrained(model, weights_path(preset, tmp_path), info={"seed": 0}, dtype=dtype)
    return model


def test_round_trip_gives_identical_logits(tmp_path):
    model = _saved(tmp_path)
    loaded = load_pretrained(TinyK3, "tiny", directory=tmp_path)
    tokens = torch.tensor([[256, 104, 105]])
    torch.testing.assert_close(loaded(tokens)[0], model(tokens)[0], rtol=0, atol=0)
    assert json.loads(weights_path("tiny", tmp_path).with_suffix(".json").read_text()) == {"seed": 0}
    assert available_pretrained(tmp_path) == ["tiny"]


def test_bfloat16_files_keep_router_bias_exact(tmp_path):
    model = _saved(tmp_path, dtype=torch.bfloat16)
    with torch.no_grad():
        for moe in model.moe_layers():
            moe.router.bias.add_(1e-3)
    save_pretrained(model, weights_path("tiny", tmp_path), dtype=torch.bfloat16)
    loaded = load_pretrained(TinyK3, "tiny", directory=tmp_path)
    assert torch.equal(loaded.moe_layers()[0].router.bias, model.moe_layers()[0].router.bias)
    assert loaded.embed.weight.dtype == torch.float32
    torch.testing.assert_close(loaded.embed.weight, model.embed.weight, atol=1e-2, rtol=1e-2)


def test_twin_checkpoints_have_their_own_config(tmp_path):
    _saved(tmp_path, "tiny-twin")
    loaded = load_pretrained(TinyK3, "tiny-twin", directory=tmp_path)
    assert set(loaded.config.layer_kinds) == {"mla"}


def test_missing_corrupt_and_mismatched_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match="no trained weights ship for preset 'tiny'; presets with weights: none"):
        load_pretrained(TinyK3, "tiny", directory=tmp_path)
    weights_path("tiny", tmp_path).write_bytes(b"\x00garbage" * 10)
    with pytest.raises(CheckpointError, match="is corrupt or unreadable"):
        load_pretrained(TinyK3, "tiny", directory=tmp_path)
    torch.manual_seed(0)
    other = TinyK3(K3Config.preset("tiny", top_k=1, num_experts=56))
    save_pretrained(other, weights_path("tiny", tmp_path))
    with pytest.raises(CheckpointError, match="trained for a different config than preset 'tiny'"):
        load_pretrained(TinyK3, "tiny", directory=tmp_path)
    with pytest.raises(Exception, match="unknown preset"):
        load_pretrained(TinyK3, "nope", directory=tmp_path)
