"""tiny_k3.swap: the model with a learner's layer inside.

A function that computes what the layer computes (here written from tiny_k3's own ops) leaves the logits as they
were, to a float64 tolerance; a function with a known mistake changes them; leaving the block, also by an error,
restores every layer.
"""

from __future__ import annotations

import pytest
import torch

from tiny_k3 import K3Config, TinyK3
from tiny_k3.kda import kda_gate, kda_recurrent
from tiny_k3.mla import softmax_attention
from tiny_k3.swap import compare, swapped

TOL = 1e-9          # float64


def project_kda_head(q, k, v, g_raw, beta_logit, A_log, dt_bias, lower_bound, S0, normalise=True):
    """One head as KDALayer computes it, from tiny_k3.kda's own gate and recurrence (q/k norm as the layer's).
    normalise=False: the mistake of skipping the L2 norm."""
    K = q.shape[-1]
    if normalise:
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
    g = kda_gate(g_raw.view(1, -1, 1, K), A_log.view(1), dt_bias, lower_bound)
    o, S = kda_recurrent(q.view(1, -1, 1, K), k.view(1, -1, 1, K), v[None, :, None], g,
                         torch.sigmoid(beta_logit).view(1, -1, 1),
                         initial_state=None if S0 is None else S0[None, None], output_final_state=True)
    return o[0, :, 0], S[0, 0]


def project_attention(cache, q, k, v, scale):
    """Append, then tiny_k3.mla.softmax_attention over the whole cache: [H, D] in, [H, V] out."""
    keys = k[None] if cache is None else torch.cat([cache[0], k[None]])
    values = v[None] if cache is None else torch.cat([cache[1], v[None]])
    _, out = softmax_attention(q[None, :, None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None], scale)
    return out[0, :, 0], (keys, values)


def project_mla_decode(q_nope, q_rope, latent, k_rope, W_kb, W_vb, scale):
    """The expanded form: every latent into per-head keys and values, then softmax_attention."""
    H, S = q_nope.shape[0], latent.shape[0]
    keys = torch.cat([torch.einsum("hnr,sr->hsn", W_kb, latent), k_rope[None].expand(H, S, -1)], -1)
    values = torch.einsum("hvr,sr->hsv", W_vb, latent)
    _, out = softmax_attention(torch.cat([q_nope, q_rope], -1)[None, :, None], keys[None], values[None], scale)
    return out[0, :, 0]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TinyK3(K3Config.preset("tiny")).double().eval()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 256, (1, 13), generator=torch.Generator().manual_seed(1))


REFERENCES = {"kda_head": project_kda_head, "attention": project_attention, "mla_decode": project_mla_decode}


@pytest.mark.parametrize("role", REFERENCES)
def test_the_projects_own_function_swapped_in_leaves_the_logits_unchanged(model, tokens, role):
    result = compare(model, tokens, **{role: REFERENCES[role]})
    assert result.max_abs_diff <= TOL, (role, result.max_abs_diff)
    assert result.next_tokens()[0] == result.next_tokens()[1]


def test_a_batch_of_two_and_token_by_token_decode_run_on_the_swapped_layers(model, tokens):
    batch = torch.cat([tokens, tokens.flip(1)])
    with torch.no_grad():
        own, _ = model(batch)
        with swapped(model, kda_head=project_kda_head, attention=project_attention) as swap:
            full, _ = model(batch)
            cache, steps = None, []
            for t in range(batch.shape[1]):
                logits, cache = model(batch[:, t:t + 1], cache)
                steps.append(logits)
    assert (own - full).abs().max() <= TOL
    assert (torch.cat(steps, 1) - own).abs().max() <= TOL
    # the learner's caches: every MLA layer, each batch row, every token, keys and values of every head
    c = model.config
    per_token = c.mla_heads * (c.qk_nope_dim + c.qk_rope_dim + c.v_head_dim)
    assert swap.kv_bytes() == len(c.mla_layers) * 2 * batch.shape[1] * per_token * 8


def _unnormalised(*args):
    return project_kda_head(*args, normalise=False)


def unscaled_attention(cache, q, k, v, scale):
    return project_attention(cache, q, k, v, 1.0)


def no_rope_decode(q_nope, q_rope, latent, k_rope, W_kb, W_vb, scale):
    return project_mla_decode(q_nope, torch.zeros_like(q_rope), latent, k_rope, W_kb, W_vb, scale)


@pytest.mark.parametrize("role, fn", [("kda_head", _unnormalised), ("attention", unscaled_attention),
                                      ("mla_decode", no_rope_decode)])
def test_a_wrong_function_swapped_in_changes_the_logits(model, tokens, role, fn):
    assert compare(model, tokens, **{role: fn}).max_abs_diff > 1e3 * TOL, role     # far outside the tolerance


def test_every_layer_is_restored_on_exit_and_on_an_error(model, tokens):
    with torch.no_grad():
        before, _ = model(tokens)
    with swapped(model, kda_head=_unnormalised, mla_decode=no_rope_decode):
        assert all("forward" in block.attn.__dict__ for block in model.blocks)
    with pytest.raises(RuntimeError, match="inside the block"):
        with swapped(model, kda_head=_unnormalised, attention=unscaled_attention):
            raise RuntimeError("inside the block")
    for block in model.blocks:
        assert not {"forward", "attend_expanded", "attend_absorbed"} & set(block.attn.__dict__), block.index
    with torch.no_grad():
        after, _ = model(tokens)
    assert (after - before).abs().max() == 0       # the same computation, the same process: unchanged


def test_what_cannot_be_swapped_is_a_clear_error(model, tokens):
    from tiny_k3 import TraceRecorder

    with pytest.raises(ValueError, match="attention= or mla_decode=, not both"):
        with swapped(model, attention=project_attention, mla_decode=project_mla_decode):
            pass
    with pytest.raises(ValueError, match="name what to swap in"):
        with swapped(model):
            pass
    with swapped(model, kda_head=project_kda_head), torch.no_grad():
        with pytest.raises(ValueError, match="recorders"):
            model(tokens, recorder=TraceRecorder())
    padded = torch.ones(2, tokens.shape[1], dtype=torch.long)
    padded[0, 0] = 0                                  # row 0 is left-padded by one token
    with swapped(model, mla_decode=project_mla_decode), torch.no_grad():
        with pytest.raises(ValueError, match="padding"):
            model(torch.cat([tokens, tokens]), attention_mask=padded)


def _keeps_the_old_cache(cache, q, k, v, scale):
    out, _ = project_attention(cache, q, k, v, scale)         # attends over every token, as it should
    return out, cache                                          # but never appends the new key and value


def _appends_twice(cache, q, k, v, scale):
    out, (keys, values) = project_attention(cache, q, k, v, scale)
    return out, (torch.cat([keys, k[None]]), torch.cat([values, v[None]]))


@pytest.mark.parametrize("attend, got", [(_keeps_the_old_cache, "None"),
                                         (_appends_twice, "keys of 2 and values of 2 tokens")])
def test_a_kv_cache_of_the_wrong_length_is_a_clear_error_not_rebuilt(model, tokens, attend, got):
    # Before the fix the next token's cache was rebuilt from the model's latents and the logits matched.
    with swapped(model, attention=attend), torch.no_grad():
        with pytest.raises(ValueError, match="KV cache") as error:
            model(tokens)
    message = str(error.value)
    assert got in message and "must hold 1 (the 0 given, the new key and value appended last)" in message
    assert "\n" not in message


def test_a_new_call_of_the_model_may_start_a_new_sequence_or_branch(model, tokens):
    """Between calls the learner's cache may be of another length: a new prompt, or decoding from an earlier
    position; the prefix is expanded again from the model's own latents and the logits stay the model's."""
    with torch.no_grad():
        own, _ = model(tokens)
        prefix, branch = model(tokens[:, :5])
        with swapped(model, attention=project_attention) as swap:
            model(tokens)                                                  # the learner's cache: 13 tokens
            rest, _ = model(tokens[:, 5:], branch)                         # back to position 5
    assert (rest - own[:, 5:]).abs().max() <= TOL
    assert swap.kv_caches[next(iter(swap.kv_caches))][0][0].shape[0] == tokens.shape[1]
