"""The released K3's config and tensor names against tiny_k3 (tiny_k3/released, tiny_k3/config.py).

The committed files: tiny_k3/released/config.json (the released config.json, verbatim) and
tiny_k3/released/k3_index_table.json (the compact table of the released safetensors index); SOURCE.md there
says where both come from.
"""

import json
import math

import pytest
import torch

from tiny_k3 import ConfigError, K3Config, TinyK3, parameter_counts
from tiny_k3.moe import route
from tiny_k3.params import selection_bias_count
from tiny_k3.released import (RELEASED_CONFIG, ReleasedFormatError, config_fields_from_released, config_json_for,
                              expand_table, load_k3_table, mapping, released_tensors, spec_bytes, table_json,
                              target_of, vision_tensors)
from tiny_k3.mxfp4 import GROUP


# ---------------------------------------------------------------------------- config.json
def test_the_released_config_is_exactly_the_k3_preset():
    config = K3Config.from_released(RELEASED_CONFIG)
    assert config == K3Config.preset("k3")
    assert config.name == "k3"
    assert K3Config.from_released(RELEASED_CONFIG.parent).layer_kinds == config.layer_kinds   # a folder works too


def test_a_k3_shaped_config_survives_config_json_for_and_back():
    small = K3Config.preset("tiny", num_layers=4, shared_intermediate=8, kda_gate_rank=8, vocab_size=300)
    back = K3Config.from_released(config_json_for(small))
    assert back.name == "released"
    assert back == small.replace(name="released", kda_chunk_size=64)   # (a compute setting, not in config.json)


@pytest.mark.parametrize("field, value, message", [
    ("moe_router_activation_func", "softmax", "moe_router_activation_func = 'softmax'"),
    ("num_expert_group", 8, "grouped routing"),
    ("num_key_value_heads", 8, "num_key_value_heads = 8"),
    ("tie_word_embeddings", True, "tie_word_embeddings"),
    ("hidden_act", "gelu", "hidden_act = 'gelu'"),
])
def test_fields_tiny_k3_does_not_model_are_named(field, value, message):
    whole = json.loads(RELEASED_CONFIG.read_text())
    whole["text_config"][field] = value
    with pytest.raises(ConfigError, match=message):
        config_fields_from_released(whole)


def test_a_schedule_that_misses_a_layer_and_a_missing_file_are_named(tmp_path):
    whole = json.loads(RELEASED_CONFIG.read_text())
    whole["text_config"]["linear_attn_config"]["kda_layers"].remove(5)
    with pytest.raises(ConfigError, match="split the 1-based layers 1..93"):
        config_fields_from_released(whole)
    with pytest.raises(ReleasedFormatError, match="no config.json"):
        K3Config.from_released(tmp_path)


# ---------------------------------------------------------------------------- the released code's differences
def test_mla_latent_norms_use_the_released_eps_and_the_rest_rms_norm_eps():
    from tiny_k3.mla import GatedMLA

    for name in ("k3", "k3-topo", "small", "tiny", "mini-56/1"):
        c = K3Config.preset(name)
        assert c.mla_latent_eps == 1e-6 and c.rms_norm_eps == 1e-5, name
    layer = GatedMLA(K3Config.preset("tiny"))
    assert layer.q_norm.eps == layer.kv_norm.eps == 1e-6
    assert K3Config.preset("tiny", mla_norm_eps=1e-5).mla_latent_eps == 1e-5     # an explicit value wins


def test_a_lone_routed_expert_keeps_its_score_and_two_are_renormalised():
    scores = torch.tensor([[0.2, 0.7, 0.4]])
    one = route(scores, None, top_k=1)
    assert one.expert_ids.tolist() == [[1]] and one.weights.tolist() == [[pytest.approx(0.7)]]
    two = route(scores, None, top_k=2)
    torch.testing.assert_close(two.weights, torch.tensor([[0.7, 0.4]]) / 1.1)
    model = TinyK3(K3Config.preset("mini-56/1"))                                  # the preset it changes
    x = torch.randn(1, 3, model.config.hidden_size)
    routing = model.blocks[1].mlp.router(x)
    torch.testing.assert_close(routing.weights, routing.scores.gather(-1, routing.expert_ids))


def test_the_selection_bias_is_the_82432_values_between_the_two_counts():
    k3 = K3Config.preset("k3")
    total, active = parameter_counts(k3)
    assert (total, active) == (2_779_484_393_568, 104_189_530_208)
    assert selection_bias_count(k3) == 82_432
    table = load_k3_table()["templates"]
    released_count = sum(math.prod(row["shape"]) * row["count"] for name, row in table.items()
                         if not name.startswith(("vision_tower", "mm_projector")) and ".experts.{expert}." not in name)
    expert_values = sum(math.prod(row["shape"]) * row["count"] * 2 for name, row in table.items()
                        if name.endswith("weight_packed"))                           # two values per byte
    a_log_pads = 69 * (128 - 96)                                                     # stored, not parameters
    assert released_count + expert_values - a_log_pads == total + selection_bias_count(k3)


# ---------------------------------------------------------------------------- the tensor names
def test_the_committed_table_is_the_released_index_byte_for_byte():
    table = load_k3_table()
    assert table["num_tensors"] == 497_220 and table["num_shards"] == 96
    assert table["bytes_from_shapes"] == table["total_size"] == 1_560_860_324_864
    assert sum(row["count"] for row in table["templates"].values()) == table["num_tensors"]
    assert sum(row["count"] * row["bytes_each"] for row in table["templates"].values()) == table["total_size"]
    assert table["missing_from_index"] == []
    from tiny_k3.released import K3_TABLE
    assert table_json(table) == K3_TABLE.read_text()          # the file is what table_json writes (no hand edits)


def test_every_released_language_tensor_maps_onto_a_k3_parameter_and_nothing_is_left_over():
    table = load_k3_table()
    names = expand_table(table)
    assert len(names) == len(set(names)) == 497_220
    k3 = K3Config.preset("k3")
    specs = released_tensors(k3)
    language = [n for n in names if target_of(n) is not None]
    others = sorted({n.split(".")[0] for n in names if target_of(n) is None})
    assert others == ["mm_projector", "vision_tower"]                               # all that is not mapped
    assert len(names) - len(language) == len(vision_tensors(json.loads(RELEASED_CONFIG.read_text()))) == 168
    assert set(language) == set(specs)                                              # same names both ways
    for name in language:                                                           # and the table's shapes
        row = table["templates"][_template(name)]
        assert tuple(row["shape"]) == specs[name].shape and row["dtype"] == specs[name].dtype, name

    model = TinyK3(k3, device="meta")
    state = {n: t.shape for n, t in model.state_dict().items()}
    filled: dict[str, int] = dict.fromkeys(state, 0)                                # values filled per entry
    expert_rows: dict[tuple[str, str], set] = {}
    for name, target in mapping(k3).items():
        shape = specs[name].shape
        assert target.tiny in state, (name, target)
        want = state[target.tiny]
        if target.how in ("copy", "buffer"):
            assert shape == tuple(want), name
            filled[target.tiny] += math.prod(shape)
        elif target.how == "row":
            assert shape == (1, want[0]) and len(want) == 1, name
            filled[target.tiny] += math.prod(shape)
        elif target.how == "pad":
            assert shape == (128,) and tuple(want) == (96,), name
            filled[target.tiny] += 96
        else:                                                                       # one expert's codes or scales
            E, rows, cols = want
            assert 0 <= target.expert < E and shape[0] == rows, name
            per = 2 if target.how == "packed" else GROUP
            assert shape[1] * per == cols, name                                     # same elements after unpacking
            expert_rows.setdefault((target.tiny, target.how), set()).add(target.expert)
            if target.how == "packed":
                filled[target.tiny] += rows * cols
    for (tiny, how), experts in expert_rows.items():
        assert experts == set(range(896)), (tiny, how)
    assert {n: filled[n] for n in state if filled[n] != math.prod(state[n])} == {}  # every value exactly once
    assert len(mapping(k3)) == 497_220 - 168


def _template(name: str) -> str:
    from tiny_k3.released import template_of
    return template_of(name)


def test_an_unknown_language_tensor_is_named():
    with pytest.raises(ReleasedFormatError, match="unknown tensor 'language_model.model.layers.3.self_attn.rope'"):
        target_of("language_model.model.layers.3.self_attn.rope")


def test_the_released_byte_count_of_a_layer():
    k3 = K3Config.preset("k3")
    specs = released_tensors(k3)
    one_expert = sum(spec_bytes(s) for n, s in specs.items() if ".layers.1.block_sparse_moe.experts.0." in n)
    assert one_expert == 3 * (3072 * 3584 // 2 + 3072 * 3584 // 32) == 17_547_264     # 4.25 bits a weight
