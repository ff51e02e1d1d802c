"""The opt-in compiled path (tiny_k3/compiled.py) against the eager reference, in float64, forward and backward.

Compiling costs seconds per op and shape, so every compiled test uses tiny shapes, each op at as few shapes as the
test needs (tests share them where they can: torch.compile keeps what it compiled for the process). Where no C++
compiler is found those tests skip and say so; the fallback tests need none.
"""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

from tiny_k3 import K3Config, TinyK3, compiled
from tiny_k3.attnres import DepthAttention, depth_attention, depth_attention_of
from tiny_k3.data import corpus_rows
from tiny_k3.kda import kda_gate, kda_recurrent
from tiny_k3.kda_chunk import kda_chunked, kda_chunked_compiled, kda_factored
from tiny_k3.train import adamw, lm_loss, train_step

F64 = torch.float64
TOL = 1e-10           # compiled vs eager in float64: both are the same sums in another order
needs_compiler = pytest.mark.skipif(compiled.compiler_problem() is not None,
                                    reason=f"compiled path not testable here: {compiled.compiler_problem()}")


def _kda_inputs(B=2, T=37, H=2, K=8, V=8, g_scale=1.0, grad=True):
    """KDA inputs in float64 (T not a multiple of the chunk: the padded tail is part of the test)."""
    q, k = (F.normalize(torch.randn(B, T, H, K, dtype=F64), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, V, dtype=F64)
    g = -g_scale * torch.rand(B, T, H, K, dtype=F64)
    beta = torch.rand(B, T, H, dtype=F64)
    S0 = torch.randn(B, H, K, V, dtype=F64)
    return [t.requires_grad_(grad) for t in (q, k, v, g, beta, S0)]


def _outputs_and_grads(fn, inputs):
    q, k, v, g, beta, S0 = inputs
    o, S = fn(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    (o.pow(2).sum() + (S * S.detach()).sum()).backward()
    found = [o.detach(), S.detach()] + [t.grad.clone() for t in inputs]
    for t in inputs:
        t.grad = None
    return found


@needs_compiler
def test_compiled_kda_equals_eager_forward_and_backward(compiling):
    inputs = _kda_inputs()
    got = _outputs_and_grads(kda_chunked_compiled, inputs)
    kernel = compiled.ops()["kda_chunked"]
    assert kernel.failed is None and kernel.compile_seconds > 0, "the compiled kernel ran"
    want = _outputs_and_grads(kda_chunked, inputs)
    for name, a, b in zip(["o", "S", "dq", "dk", "dv", "dg", "dbeta", "dS0"], got, want):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0, msg=name)


@needs_compiler
def test_compiled_kda_hands_a_decay_too_strong_to_factor_to_the_eager_forms(compiling):
    inputs = _kda_inputs(g_scale=60.0)          # (the shapes of the test above: nothing compiles again)
    got = _outputs_and_grads(kda_chunked_compiled, inputs)
    want = _outputs_and_grads(kda_chunked, inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)
    with torch.no_grad():   # without autograd: the C recurrence (or eager where none builds), the same numbers
        o, _ = kda_chunked_compiled(*inputs[:5])
        torch.testing.assert_close(o, kda_recurrent(*inputs[:5])[0], atol=TOL, rtol=0)


def test_kda_factored_eager_equals_the_recurrence():
    q, k, v, g, beta, S0 = _kda_inputs(grad=False)
    B, T, H, K, V = *q.shape, v.shape[-1]
    o, S, spread = kda_factored(q, k, v, g, beta, S0.reshape(B * H, K, V), K ** -0.5, 16)
    o_ref, S_ref = kda_recurrent(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    torch.testing.assert_close(o, o_ref, atol=TOL, rtol=0)
    torch.testing.assert_close(S.view(B, H, K, V), S_ref, atol=TOL, rtol=0)
    assert 0 < float(spread) < 16, "the range of Γ_C - Γ: at most 15 tokens of g >= -1"


@needs_compiler
def test_torch_compile_of_kda_chunked_itself_equals_eager():
    x = _kda_inputs(B=1, T=40, grad=False)[:5]
    with torch.inference_mode():
        o = torch.compile(kda_chunked, dynamic=False)(*x)[0]
        torch.testing.assert_close(o, kda_chunked(*x)[0], atol=TOL, rtol=0)


@needs_compiler
@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_compiled_decay_gate_equals_eager(compiling, lower_bound):
    g_raw = torch.randn(2, 5, 2, 8, dtype=F64)
    A_log, dt_bias = torch.randn(2, dtype=F64).requires_grad_(), torch.randn(16, dtype=F64).requires_grad_()
    gate = compiled.ops()["kda_gate"]
    got = gate(g_raw, A_log, dt_bias, lower_bound)
    got_grads = torch.autograd.grad(got.pow(2).sum(), (A_log, dt_bias))
    want = kda_gate(g_raw, A_log, dt_bias, lower_bound)
    want_grads = torch.autograd.grad(want.pow(2).sum(), (A_log, dt_bias))
    assert gate.failed is None
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)


def _depth_read_and_grads(depth, sources, probe):
    h, weights = depth(sources)
    grads = torch.autograd.grad(h.pow(2).sum() + (weights * probe).sum(), [*sources, depth.query, depth.key_norm])
    return [h.detach(), weights.detach(), *grads]


@needs_compiler
def test_compiled_depth_read_equals_eager_forward_and_backward(compiling):
    torch.manual_seed(0)
    depth = DepthAttention(8, dtype=F64)
    with torch.no_grad():
        depth.query.normal_()                       # not the zero init: weights far from uniform
        depth.key_norm.uniform_(0.5, 1.5)
    sources = [torch.randn(2, 5, 8, dtype=F64, requires_grad=True) for _ in range(3)]
    probe = torch.randn(2, 5, 3, dtype=F64)
    got = _depth_read_and_grads(depth, sources, probe)
    read = compiled.ops()["depth_attention"]
    assert read.failed is None and read.compile_seconds > 0, "the compiled read ran"
    compiled.enable(False)
    want = _depth_read_and_grads(depth, sources, probe)
    for name, a, b in zip(["h", "weights", "dv0", "dv1", "dv2", "dquery", "dkey_norm"], got, want):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0, msg=name)


def test_depth_attention_of_separate_sources_is_the_stacked_read():
    sources = [torch.randn(2, 3, 4, dtype=F64) for _ in range(2)]
    query, gain = torch.randn(4, dtype=F64), torch.rand(4, dtype=F64)
    for a, b in zip(depth_attention_of(query, gain, 1e-6, *sources),
                    depth_attention(torch.stack(sources), query, gain, 1e-6)):
        assert torch.equal(a, b)


@needs_compiler
def test_a_compiled_training_step_equals_an_eager_one(compiling):
    config = K3Config.preset("tiny")
    torch.manual_seed(0)
    eager = TinyK3(config, dtype=F64)
    fast = copy.deepcopy(eager)
    rows = corpus_rows(2, 24, seed=3)
    compiled.enable(False)
    loss_eager = lm_loss(eager, rows)
    loss_eager.backward()
    compiled.enable(True)
    loss_fast = lm_loss(fast, rows)
    loss_fast.backward()
    assert compiled.ops()["kda_chunked"].compile_seconds > 0 and compiled.ops()["depth_attention"].compile_seconds > 0
    torch.testing.assert_close(loss_fast, loss_eager, atol=TOL, rtol=0)
    for (name, a), b in zip(fast.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=TOL, rtol=0, msg=name)
    # and the whole step (clip, AdamW, the router bias update) from those gradients
    for model in (eager, fast):
        model.zero_grad(set_to_none=True)
    compiled.enable(False)
    assert adamw(eager, 1e-3, 0.1).defaults["fused"] is None, "eager keeps torch's default AdamW"
    train_step(eager, adamw(eager, 1e-3, 0.1), rows, 1.0, True, 0)
    compiled.enable(True)
    optimiser = adamw(fast, 1e-3, 0.1)
    assert optimiser.defaults["fused"] is True, "the compiled path's AdamW is torch's fused one"
    train_step(fast, optimiser, rows, 1.0, True, 0)
    for (name, a), b in zip(fast.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0, msg=name)


def test_without_a_compiler_an_op_runs_eager_and_says_why_once(compiling, monkeypatch):
    monkeypatch.setattr(compiled, "compiler_problem", lambda: "no C++ compiler found (test)")
    monkeypatch.setattr(compiled, "_warned", set())
    op = compiled.Op("double", lambda x: 2 * x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert op(torch.ones(2)).tolist() == [2.0, 2.0]
        assert op(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert said == ["tiny_k3: the compiled path runs eager, not compiled: no C++ compiler found (test)"]
    assert op.failed and op.compile_seconds == 0


def test_a_failed_compile_runs_eager_but_an_input_error_still_raises(compiling, monkeypatch):
    def broken(fn, **_):
        def run(*args, **kwargs):
            raise RuntimeError("inductor could not lower this\nsecond line")
        return run

    monkeypatch.setattr(compiled, "compiler_problem", lambda: None)
    monkeypatch.setattr(compiled, "_warned", set())
    monkeypatch.setattr(torch, "compile", broken)
    op = compiled.Op("sum", lambda x: x.sum())
    with pytest.warns(RuntimeWarning, match="tiny_k3: sum runs eager, not compiled: RuntimeError: inductor could not"):
        assert op(torch.ones(4)).item() == 4.0
    assert op(torch.ones(2)).item() == 2.0 and op.failed.endswith("lower this")

    def checked(x):
        if x.dim() != 1:
            raise ValueError("x must be a vector")
        return x

    strict = compiled.Op("checked", checked)
    with pytest.raises(ValueError, match="x must be a vector"):
        strict(torch.ones(2, 2))


def test_the_switch_reads_the_environment_and_is_off_by_default():
    for value, on in [("1", True), ("0", False), ("", False), (None, False), ("yes", True), (" OFF ", False)]:
        assert compiled.switched_on(value) is on, value
    before = compiled.enabled()
    compiled.enable(False)
    op = compiled.op("plain", lambda x: x + 1)
    assert compiled.ops()["plain"] is op and op(torch.zeros(1)).item() == 1.0, "off: the eager function"
    assert op.compile_seconds == 0 and compiled.compile_seconds() >= 0.0
    compiled.enable(before)


@needs_compiler
def test_train_with_compile_says_so_in_its_log_and_record(compiling, tmp_path, capsys):
    import json

    from tiny_k3.train import main

    compiled.enable(False)     # --compile turns it on (the fixture puts the switch back afterwards)
    argv = ["--preset", "tiny", "--steps", "4", "--batch", "2", "--seq-len", "24", "--out", str(tmp_path), "--compile"]
    assert main(argv) == 0
    info = json.loads((tmp_path / "tiny.json").read_text())
    assert info["compiled"]["on"] and info["compiled"]["eager_because"] == {}
    assert "compiled path on" in capsys.readouterr().out


def test_allow_recompiles_raises_the_limit_and_never_lowers_it(monkeypatch):
    import torch._dynamo.config as dynamo
    monkeypatch.setattr(dynamo, "recompile_limit", 8)
    compiled.allow_recompiles(40)
    assert dynamo.recompile_limit == 40
    compiled.allow_recompiles(10)
    assert dynamo.recompile_limit == 40
