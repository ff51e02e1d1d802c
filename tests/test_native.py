"""KDA's recurrence as a C loop (tiny_k3/kda_native.c, built by tiny_k3/native.py) against the definition.

The kernel is part of the opt-in compiled path: without autograd on the CPU, `kda_chunked_compiled` runs it. Where
no C compiler is found the tests that build it skip and say so; the fallback tests need none.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

from tiny_k3 import compiled, native
from tiny_k3.kda import kda_recurrent
from tiny_k3.kda_chunk import kda_chunked, kda_chunked_compiled

F64 = torch.float64
TOL = 1e-12      # float64: the same sums as the definition, in another order
needs_cc = pytest.mark.skipif(native.c_compiler() is None, reason="no C compiler ($CC, cc, gcc or clang) here")


def _inputs(B, T, H, K, V, dtype=F64, g_scale=1.0):
    q, k = (F.normalize(torch.randn(B, T, H, K, dtype=dtype), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, V, dtype=dtype)
    g = -g_scale * torch.rand(B, T, H, K, dtype=dtype)
    beta = torch.rand(B, T, H, dtype=dtype)
    S0 = torch.randn(B, H, K, V, dtype=dtype)
    return q, k, v, g, beta, S0


@needs_cc
@pytest.mark.parametrize("shape", [(2, 37, 3, 16, 24),    # V below one block of columns: the scalar tail alone
                                   (1, 9, 2, 20, 70),     # full blocks and a tail
                                   (2, 11, 1, 64, 64),    # the bench's head: blocks only
                                   (1, 6, 3, 8, 32),      # heads side by side: one float64 block each
                                   (1, 1, 1, 3, 1)])      # one token, one column
def test_c_recurrence_equals_the_definition(build_dir, shape):
    torch.manual_seed(0)
    q, k, v, g, beta, S0 = _inputs(*shape)
    o, S = native.kda_recurrent_native(q, k, v, g, beta, S0, 0.3)
    o_ref, S_ref = kda_recurrent(q, k, v, g, beta, scale=0.3, initial_state=S0, output_final_state=True)
    torch.testing.assert_close(o, o_ref, atol=TOL, rtol=0)
    torch.testing.assert_close(S, S_ref, atol=TOL, rtol=0)
    assert S0.abs().sum() > 0 and not torch.equal(S, S0), "the caller's initial state is read, not overwritten"


@needs_cc
def test_c_recurrence_in_float32_and_on_strided_inputs(build_dir):
    torch.manual_seed(1)
    q, k, v, g, beta, S0 = _inputs(1, 50, 2, 32, 40, dtype=torch.float32)
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)          # same values, another layout
    o, S = native.kda_recurrent_native(q_strided, k, v, g, beta, S0, 0.5)
    o_ref, S_ref = kda_recurrent(*(t.double() for t in (q, k, v, g, beta)), scale=0.5, initial_state=S0.double(),
                                 output_final_state=True)
    assert o.dtype == torch.float32
    torch.testing.assert_close(o.double(), o_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(S.double(), S_ref, atol=1e-5, rtol=0)


@needs_cc
def test_the_build_is_kept_and_reused(build_dir):
    assert native.problem(F64) is None
    built = sorted(p.name for p in build_dir.iterdir())
    assert len(built) == 1 and built[0].startswith("kda_native_double_") and built[0].endswith(".so")
    native._library.cache_clear()
    stamp = (build_dir / built[0]).stat().st_mtime_ns
    assert native.problem(F64) is None
    assert (build_dir / built[0]).stat().st_mtime_ns == stamp, "a second process loads the kept library"


@needs_cc
def test_compiled_switch_runs_the_c_recurrence_without_autograd(build_dir, compiling, monkeypatch):
    torch.manual_seed(2)
    q, k, v, g, beta, S0 = _inputs(2, 45, 2, 16, 16)
    calls = []
    real = native.kda_recurrent_native
    monkeypatch.setattr(native, "kda_recurrent_native", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        o, S = kda_chunked_compiled(q, k, v, g, beta, initial_state=S0, output_final_state=True)
        o_ref, S_ref = kda_chunked(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    assert calls == [1], "without autograd on the CPU the switch takes the C loop"
    torch.testing.assert_close(o, o_ref, atol=TOL, rtol=0)
    torch.testing.assert_close(S, S_ref, atol=TOL, rtol=0)


def test_refuses_inputs_that_need_gradients_before_building_anything(build_dir):
    q, k, v, g, beta, S0 = _inputs(1, 4, 1, 4, 4)
    with pytest.raises(ValueError, match="no gradient"):
        native.kda_recurrent_native(q.requires_grad_(), k, v, g, beta, S0, 0.5)
    assert not list(build_dir.iterdir()), "refused before any build"


@needs_cc
def test_inputs_that_require_grad_are_computed_where_no_gradient_is_wanted(build_dir):
    q, k, v, g, beta, S0 = _inputs(1, 4, 1, 4, 4)
    with torch.no_grad():
        o, _ = native.kda_recurrent_native(q.requires_grad_(), k, v, g, beta, S0, 0.5)
    torch.testing.assert_close(o, kda_recurrent(q.detach(), k, v, g, beta, scale=0.5, initial_state=S0)[0],
                               atol=TOL, rtol=0)


def test_other_dtypes_are_refused_with_a_reason():
    assert "float32 or float64" in native.problem(torch.bfloat16)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        native.library(torch.bfloat16, "moe")


def test_without_a_c_compiler_the_switch_falls_back_with_one_line(build_dir, compiling, monkeypatch):
    monkeypatch.setenv("CC", "")
    monkeypatch.setenv("PATH", str(build_dir))          # nothing to build with
    assert native.c_compiler() is None
    assert native.problem(F64) == "no C compiler found ($CC, cc, gcc or clang)"
    compiled._warned.discard("kda_chunked (the C recurrence)")
    torch.manual_seed(3)
    q, k, v, g, beta, S0 = _inputs(1, 20, 2, 8, 8)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        o, _ = kda_chunked_compiled(q, k, v, g, beta, initial_state=S0)
    lines = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert lines == ["tiny_k3: kda_chunked (the C recurrence) runs eager, not compiled: no C compiler found "
                     "($CC, cc, gcc or clang)"]
    torch.testing.assert_close(o, kda_recurrent(q, k, v, g, beta, initial_state=S0)[0], atol=TOL, rtol=0)


@needs_cc
def test_a_failed_build_says_what_the_compiler_said(build_dir, monkeypatch, tmp_path):
    broken = tmp_path / "kda_native.c"
    broken.write_text("this is not C;\n")
    monkeypatch.setitem(native.SOURCES, "kda", broken)
    reason = native.problem(F64)
    assert reason is not None and "could not build kda_native.c" in reason and "\n" not in reason
    assert not list(build_dir.glob("*.so")), "nothing half-built is kept"


# --------------------------------------------------------- the MoE's expert products and selection (moe_native.c)
def _moe(dtype=F64, **changes):
    from tiny_k3 import K3Config
    from tiny_k3.moe import LatentMoE
    torch.manual_seed(4)
    return LatentMoE(K3Config.preset("small").replace(**changes), dtype=dtype)


@needs_cc
@pytest.mark.parametrize("token_major", [True, False])
@pytest.mark.parametrize("widths", [{}, {"moe_intermediate": 12, "latent_dim": 20}],   # small's 8, 16: runs of 8
                         ids=["small", "runs-and-tails"])                             # only; 12, 20: tails too
def test_c_expert_products_equal_mix_experts_outputs_and_every_gradient(build_dir, token_major, widths):
    from tiny_k3.moe_native import mix_experts_native
    moe = _moe(**widths)
    N, k = 40, moe.config.top_k
    z0 = torch.randn(N, moe.config.latent_dim, dtype=F64)
    ids = torch.randint(0, 60, (N * k,))                      # a few experts many pairs, most experts none
    w0 = torch.rand(N * k, dtype=F64)
    token = None if token_major else torch.randint(0, N, (N * k,))
    found = []
    for mix in (moe.mix_experts, lambda *a: mix_experts_native(moe, *a)):
        z, w = z0.clone().requires_grad_(), w0.clone().requires_grad_()
        moe.zero_grad()
        y = mix(z, ids, w, token)
        (y * torch.linspace(-1, 1, y.numel(), dtype=F64).view_as(y)).sum().backward()
        found.append([y.detach(), z.grad, w.grad, moe.w1.grad.clone(), moe.w3.grad.clone(), moe.w2.grad.clone()])
    for name, a, b in zip(["y", "dz", "dweights", "dW1", "dW3", "dW2"], *found):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0, msg=name)
    assert found[0][3].abs().sum() > 0, "the gradients compared are not all zero"


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_c_selection_is_topk_exactly_ties_and_nan_included(build_dir, dtype):
    from tiny_k3.moe_native import top_k_ids_native
    torch.manual_seed(5)
    scores = torch.rand(64, 96, dtype=dtype)
    scores[1] = 0.5                                             # a row of ties
    scores[2, 7] = float("nan")
    scores[3] = float("-inf")
    scores[4, :20] = scores[4].max()                            # ties at the top
    scores[10:20] *= torch.linspace(1.0, 0.01, 10, dtype=dtype).unsqueeze(1) * 0.001   # each row below the last's floor
    bias = torch.randn(96, dtype=dtype) * 0.01
    for k in (1, 2, 16, 95, 96):
        want = (scores + bias).topk(k, dim=-1, sorted=True).indices
        assert torch.equal(top_k_ids_native(scores, bias, k), want), k


@needs_cc
def test_compiled_switch_routes_and_mixes_in_c_and_equals_eager(build_dir, compiling, monkeypatch):
    from tiny_k3 import moe_native
    moe = _moe()
    x = torch.randn(2, 24, moe.config.hidden_size, dtype=F64)
    calls = []
    for name in ("mix_experts_native", "sigmoid_top_k_ids_native"):
        real = getattr(moe_native, name)
        monkeypatch.setattr(moe_native, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    found = []
    for on in (True, False):
        compiled.enable(on)
        xx = x.clone().requires_grad_()
        moe.zero_grad()
        y = moe(xx)
        y.pow(2).sum().backward()
        found.append([y.detach(), xx.grad, moe.router.weight.grad.clone(), moe.w1.grad.clone()])
    assert calls == ["sigmoid_top_k_ids_native", "mix_experts_native"], calls
    for a, b in zip(*found):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)


def test_without_a_c_compiler_the_moe_falls_back_with_one_line(build_dir, compiling, monkeypatch):
    monkeypatch.setattr(native, "c_compiler", lambda: None)   # (PATH kept: inductor's C++ compiler is another matter)
    compiled._warned.discard("the MoE's expert products (C)")
    moe = _moe()
    x = torch.randn(1, 10, moe.config.hidden_size, dtype=F64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = moe(x.requires_grad_())
    lines = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert "tiny_k3: the MoE's expert products (C) runs eager, not compiled: no C compiler found " \
           "($CC, cc, gcc or clang)" in lines, lines
    assert all(line.endswith("no C compiler found ($CC, cc, gcc or clang)") for line in lines), lines   # (and
    assert len(lines) == len(set(lines))                              # RMSNorm's C kernel says so too, once)
    compiled.enable(False)
    torch.testing.assert_close(y, moe(x), atol=TOL, rtol=0)


@needs_cc
def test_expert_order_is_a_stable_argsort_and_refuses_ids_out_of_range(build_dir):
    from tiny_k3.moe_native import expert_order
    ids = torch.randint(0, 12, (300,))
    order, starts = expert_order(ids, 15)                       # experts 12-14 get no pair
    assert torch.equal(order, torch.argsort(ids, stable=True))
    assert torch.equal(starts, torch.cat([torch.zeros(1, dtype=torch.long),
                                          torch.bincount(ids, minlength=15).cumsum(0)]))
    with pytest.raises(ValueError, match="expert ids must lie in 0..14"):
        expert_order(torch.tensor([0, 15]), 15)
