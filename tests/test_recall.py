"""tiny_k3.recall: probes that ask for values defined earlier in the line, scored teacher-forced."""

from __future__ import annotations

import random
import re

import pytest
import torch

from tiny_k3 import K3Config
from tiny_k3.config import ConfigError
from tiny_k3.recall import make_probe, make_probes, recall_accuracy
from tiny_k3.tokenizer import decode


def test_probe_positions_point_at_the_recalled_values():
    probe = make_probe(random.Random(3), pairs=4, filler_chars=50)
    text = decode(probe.tokens.tolist())
    defined = dict(re.findall(r"([a-z])=(\d);", decode(probe.tokens[:probe.define_end].tolist())))
    assert len(defined) == 4 and probe.tokens[0] == 256          # BOS first, four distinct letters
    assert text[probe.query_start - 2] == "|"
    asked = [(chr(int(probe.tokens[p - 1])), chr(int(probe.tokens[p + 1]))) for p in probe.answer_at]
    assert all(chr(int(probe.tokens[p])) == "=" for p in probe.answer_at)
    assert sorted(asked) == sorted(defined.items())              # every key asked once, with its value
    assert min(probe.answer_at) >= probe.query_start


class _Oracle(torch.nn.Module):
    """Puts all probability on the true next token, or on `wrong` when given: the score must follow."""

    def __init__(self, wrong: int | None = None):
        super().__init__()
        self.wrong, self.anchor = wrong, torch.nn.Parameter(torch.zeros(1))

    @property
    def device(self):
        return self.anchor.device

    def forward(self, tokens):
        logits = torch.zeros(*tokens.shape, 512)
        nxt = torch.roll(tokens, -1, dims=1) if self.wrong is None else torch.full_like(tokens, self.wrong)
        logits.scatter_(-1, nxt[..., None], 1.0)
        return logits, None


def test_recall_accuracy_against_oracles():
    probes = make_probes(10, pairs=3, filler_chars=20, seed=1)
    assert recall_accuracy(_Oracle(), probes) == 1.0
    assert recall_accuracy(_Oracle(wrong=ord("x")), probes) == 0.0
    hits = sum(chr(int(p.tokens[a + 1])) == "5" for p in probes for a in p.answer_at)
    assert recall_accuracy(_Oracle(wrong=ord("5")), probes) == pytest.approx(hits / 30)


def test_probes_are_seeded():
    a, b = make_probes(3, 2, 10, seed=4), make_probes(3, 2, 10, seed=4)
    assert all(torch.equal(x.tokens, y.tokens) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="1 to 52 pairs"):
        make_probes(1, 53, 0, seed=0)


def test_small_kda_is_the_only_preset_that_may_end_in_kda():
    cfg = K3Config.preset("small-kda")
    assert set(cfg.layer_kinds) == {"kda"}
    assert cfg.replace(layer_kinds=("mla",) * 8).hidden_size == K3Config.preset("small").hidden_size
    with pytest.raises(ConfigError, match="must end with an MLA layer"):
        K3Config.preset("small").replace(layer_kinds=("kda",) * 8)


def _tiny_model(preset="tiny"):
    from tiny_k3 import TinyK3
    torch.manual_seed(0)
    return TinyK3(K3Config.preset(preset).replace(dtype="float64"))


def test_edited_recall_with_no_edit_equals_the_full_forward():
    from tiny_k3.recall import edited_recall_accuracy
    model = _tiny_model()
    probes = make_probes(6, pairs=2, filler_chars=30, seed=2)
    assert edited_recall_accuracy(model, probes) == recall_accuracy(model, probes)


def test_hiding_definitions_equals_an_attention_mask_and_reset_zeroes_kda_states():
    from tiny_k3.cache import KDAState, MLACache
    from tiny_k3.recall import hide_definitions_from_mla, reset_kda_states
    model = _tiny_model()
    probe = make_probes(1, pairs=3, filler_chars=10, seed=3)[0]
    _, cache = model(probe.tokens[None, :probe.query_start])
    lengths = [c.length for c in cache.layers if isinstance(c, MLACache)]
    hide_definitions_from_mla(cache, probe)
    assert [c.length for c in cache.layers if isinstance(c, MLACache)] == [n - (probe.define_end - 1) for n in lengths]
    reset_kda_states({0})(cache, probe)
    assert cache.layers[0].state.abs().sum() == 0 and cache.layers[1].state.abs().sum() > 0
    reset_kda_states()(cache, probe)
    assert all(c.state.abs().sum() == 0 and c.conv.abs().sum() == 0 for c in cache.layers if isinstance(c, KDAState))

    # the hidden rows are exactly a mask: an MLA layer over the kept rows == softmax over all rows with
    # the definitions' scores set to -inf (checked on the last MLA layer's attention of the next token)
    from tiny_k3.mla import GatedMLA
    mla = next(b.attn for b in model.blocks if isinstance(b.attn, GatedMLA))
    x = torch.randn(1, 1, model.config.hidden_size, dtype=torch.float64)
    full = MLACache(torch.randn(1, 9, mla.kv_rank, dtype=torch.float64), torch.randn(1, 9, mla.rope, dtype=torch.float64))
    keep = torch.tensor([0, 4, 5, 6, 7, 8])
    y_kept, _ = mla(x, MLACache(full.latent[:, keep], full.k_rope[:, keep]))
    latent = torch.cat([full.latent, mla.kv_norm(mla.kv_a_proj(x)[..., :mla.kv_rank])], 1)
    k_rope = torch.cat([full.k_rope, mla.kv_a_proj(x)[..., mla.kv_rank:]], 1)
    k_nope, v = mla.kv_b_proj(latent).view(1, 10, mla.heads, -1).split([mla.nope, mla.v_dim], -1)
    k = torch.cat([k_nope, k_rope[:, :, None].expand(1, 10, mla.heads, mla.rope)], -1)
    scores = torch.einsum("bthd,bshd->bhts", mla.project_q(x), k) * mla.scale
    scores[..., 1:4] = float("-inf")
    attn = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v)
    gate = torch.sigmoid(mla.g_proj(x)).view(1, 1, mla.heads, mla.v_dim)
    assert torch.allclose(y_kept, mla.o_proj((attn * gate).reshape(1, 1, -1)), atol=1e-12)


def test_wilson_interval_matches_the_formula_and_contains_the_share():
    from tiny_k3.recall import wilson_interval
    low, high = wilson_interval(8, 10)
    # Wilson (1927) at z = 1.96, worked by hand: centre 0.7171, half-width 0.2288
    assert abs(low - 0.4902) < 1e-3 and abs(high - 0.9433) < 1e-3, (low, high)
    for n in (1, 7, 48, 208):
        for hits in range(n + 1):
            lo, hi = wilson_interval(hits, n)
            assert 0.0 <= lo <= hits / n <= hi <= 1.0, (hits, n, lo, hi)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    with pytest.raises(ValueError, match="0 <= hits <= n"):
        wilson_interval(11, 10)


def test_52_pairs_use_every_key_a_to_z_then_A_to_Z_once_and_26_keep_lowercase():
    from tiny_k3.corpus import KEYS, LETTERS
    from tiny_k3.tokenizer import decode

    (probe,) = make_probes(1, 52, 16, seed=3)
    line = decode(probe.tokens[1:].tolist())
    define, ask = line.split(" | ")
    defined = dict(pair.split("=") for pair in define.split(";")[:52] if "=" in pair for pair in [pair.strip()])
    assert sorted(defined) == sorted(KEYS) and len(probe.answer_at) == 52
    for p in probe.answer_at:                      # each answer position is a query `k=` whose value was defined
        key = chr(int(probe.tokens[p - 1]))
        assert chr(int(probe.tokens[p])) == "=" and chr(int(probe.tokens[p + 1])) == defined[key]
    (few,) = make_probes(1, 26, 0, seed=3)
    assert set(decode(few.tokens[1:few.define_end].tolist())) <= set(LETTERS + "0123456789=; ")
