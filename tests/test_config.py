import pytest

from tiny_k3 import ConfigError, K3Config
from tiny_k3.config import ALL_KDA_ABLATIONS, LINEAGE_PRESETS, k3_schedule


def test_presets_exist_and_keep_the_56_to_1_ratio():
    names = K3Config.presets()
    for required in ["k3", "k3-topo", "mini-56/1", "mini-112/2", "mini-224/4", "mini-448/8", "mini-896/16",
                     "small", "tiny"]:
        assert required in names
    for name in names:
        if name in LINEAGE_PRESETS:  # K2 and Kimi Linear keep their own shape (tests/test_lineage.py)
            continue
        cfg = K3Config.preset(name)
        assert cfg.num_experts == 56 * cfg.top_k, name
        assert cfg.layer_kinds[-1] == "mla" or name in ALL_KDA_ABLATIONS, name
        assert cfg.num_shared_experts == 2, name
        assert cfg.residual == "block", name


def test_k3_schedule_is_69_kda_and_24_mla_ending_in_two_mla():
    kinds = k3_schedule(93)
    assert kinds.count("kda") == 69 and kinds.count("mla") == 24
    mla_1_based = [i + 1 for i, k in enumerate(kinds) if k == "mla"]
    assert mla_1_based == list(range(4, 93, 4)) + [93]
    assert K3Config.preset("k3").layer_kinds == kinds
    assert K3Config.preset("k3-topo").layer_kinds == kinds


def test_mini_family_is_iso_active():
    for n, k in [(56, 1), (112, 2), (224, 4), (448, 8), (896, 16)]:
        cfg = K3Config.preset(f"mini-{n}/{k}")
        assert cfg.top_k * cfg.moe_intermediate == 256
        assert cfg.mla_layers == [3, 7]


def test_twin_has_only_mla_layers():
    twin = K3Config.preset("tiny").twin()
    assert set(twin.layer_kinds) == {"mla"} and twin.name == "tiny-twin"


@pytest.mark.parametrize("changes, needle", [
    (dict(top_k=200), "top_k (200) cannot be larger than num_experts (112)"),
    (dict(layer_kinds=("kda", "kda", "mla", "kda")), "must end with an MLA layer"),
    (dict(layer_kinds=("kda", "mla")), "layer_kinds has 2 entries but num_layers is 4"),
    (dict(layer_kinds=("kda", "kda", "gqa", "mla")), "may only contain 'kda' and 'mla'"),
    (dict(residual="highway"), "residual must be one of block, full, standard"),
    (dict(hidden_size=0), "hidden_size must be a positive integer"),
    (dict(vocab_size=100), "vocab_size must be at least 258"),
    (dict(dtype="int8"), "dtype must be one of"),
    (dict(kda_gate_lower_bound=1.0), "kda_gate_lower_bound must be negative"),
])
def test_validation_errors_are_one_clear_sentence(changes, needle):
    with pytest.raises(ConfigError) as info:
        K3Config.preset("tiny", **changes)
    message = str(info.value)
    assert needle in message and "\n" not in message


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown preset 'k4'; valid presets are: k3, k3-topo"):
        K3Config.preset("k4")


def test_runnable_presets_are_all_but_the_counted_only_ones():
    from tiny_k3 import TinyK3
    from tiny_k3.config import COUNTED_ONLY

    runnable = K3Config.runnable_presets()
    assert "k3" in COUNTED_ONLY and "k3" not in runnable and {"tiny", "small", "k3-topo"} <= set(runnable)
    assert sorted(runnable + sorted(COUNTED_ONLY)) == sorted(K3Config.presets())
    for name in runnable:   # each one really builds (on meta here: the shapes, not the memory)
        assert sum(p.numel() for p in TinyK3(K3Config.preset(name), device="meta").parameters()) < 1e9, name
