"""The C kernels of the compiled training path beside their PyTorch references, float64, values and gradients:
KDA's short conv with its SiLU and q/k norms (tiny_k3/conv_native.c), RMSNorm (norm_native.c), the router's
chosen-score backward and selection (moe_native.c); and the ctypes layer that calls them (tiny_k3/native.py).
Where no C compiler is found the tests that build skip and say so."""

import platform

import pytest
import torch
import torch.nn.functional as F

from tiny_k3 import compiled, conv_native, native
from tiny_k3.kda import conv_heads
from tiny_k3.moe import ChosenScores
from tiny_k3.norm import RMSNormNative, rms_norm

F64 = torch.float64
needs_cc = pytest.mark.skipif(native.c_compiler() is None, reason="no C compiler ($CC, cc, gcc or clang) here")


def _grads(fn, inputs, weights_out):
    """fn(*inputs) -> outputs; the outputs, and the gradients of sum(out * w) for every input."""
    for t in inputs:
        t.grad = None
    outs = fn(*inputs)
    sum((o * w).sum() for o, w in zip(outs, weights_out)).backward()
    return [o.detach() for o in outs] + [t.grad.clone() for t in inputs]


# ------------------------------------------------------------------------------------------- the short conv
@needs_cc
@pytest.mark.parametrize("B, T, H, K, V, W", [(2, 9, 2, 32, 32, 4),   # small's widths
                                              (3, 2, 1, 8, 16, 4),    # fewer tokens than taps: a tail of zeros
                                              (1, 33, 4, 16, 8, 3)])
@pytest.mark.parametrize("scale", [1.0, 60.0])                        # 60: the SiLU far into both saturations
def test_c_conv_equals_conv_heads_outputs_and_gradients(build_dir, B, T, H, K, V, W, scale):
    torch.manual_seed(0)
    C = 2 * H * K + H * V
    x = (torch.randn(B, T, C, dtype=F64) * scale).requires_grad_()
    weight = torch.randn(C, 1, W, dtype=F64).requires_grad_()
    probe = [torch.randn(B, T, H, K, dtype=F64), torch.randn(B, T, H, K, dtype=F64), torch.randn(B, T, H, V, dtype=F64),
             torch.zeros(B, W - 1, C, dtype=F64)]
    want = _grads(lambda a, b: conv_heads(a, b, H, K, V, F64), [x, weight], probe)
    got = _grads(lambda a, b: conv_native.conv_heads_native(a, b, H, K, V), [x, weight], probe)
    for name, a, b in zip(["q", "k", "v", "tail", "dx", "dweight"], got, want):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, atol=1e-11 * max(1.0, b.abs().max().item()), rtol=0, msg=name)
    assert want[5].abs().sum() > 0, "the gradients compared are not all zero"


@needs_cc
def test_c_conv_in_float32_is_the_float64_result_rounded(build_dir):
    torch.manual_seed(1)
    x, weight = torch.randn(2, 11, 96), torch.randn(96, 1, 4)
    got = conv_native.conv_heads_native(x, weight, 1, 32, 32)
    want = conv_heads(x.double(), weight.double(), 1, 32, 32, F64)
    for a, b in zip(got, want):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, atol=2e-6, rtol=0)


def test_c_conv_says_why_it_cannot_take_a_call():
    x, w = torch.zeros(1, 2, 20), torch.zeros(20, 1, 4)
    assert "runs of 8" in conv_native.available(x, w, 1, 4, torch.float32)
    assert "dtype" in conv_native.available(x, w, 1, 4, F64)
    x, w = torch.zeros(1, 2, 24, dtype=torch.float16), torch.zeros(24, 1, 4, dtype=torch.float16)
    assert "float32 or float64" in conv_native.available(x, w, 1, 8, torch.float16)


# ------------------------------------------------------------------------------------------------ RMSNorm
@needs_cc
@pytest.mark.parametrize("D", [64, 20, 3])     # runs of 8, runs and a tail, a tail alone
def test_c_rms_norm_equals_torch_outputs_and_gradients(build_dir, D):
    torch.manual_seed(2)
    x = torch.randn(4, 7, D, dtype=F64).requires_grad_()
    w = (1 + 0.3 * torch.randn(D, dtype=F64)).requires_grad_()
    probe = [torch.randn(4, 7, D, dtype=F64)]
    want = _grads(lambda a, b: [F.rms_norm(a, (D,), b, 1e-6)], [x, w], probe)
    got = _grads(lambda a, b: [RMSNormNative.apply(a, b, 1e-6)], [x, w], probe)
    for name, a, b in zip(["y", "dx", "dw"], got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0, msg=name)


@needs_cc
def test_rms_norm_takes_the_c_path_only_when_compiled_and_training(build_dir, compiling, monkeypatch):
    calls = []
    real = RMSNormNative.apply
    monkeypatch.setattr(RMSNormNative, "apply", lambda *a: calls.append(1) or real(*a))
    x, w = torch.randn(3, 16, dtype=F64, requires_grad=True), torch.ones(16, dtype=F64, requires_grad=True)
    rms_norm(x, w)
    assert calls == [1]
    with torch.no_grad():
        rms_norm(x, w)                      # no autograd: torch's op (and the decode path) as before
    compiled.enable(False)
    rms_norm(x, w)
    assert calls == [1]


# ------------------------------------------------------------------------------------------------ the router
@needs_cc
@pytest.mark.parametrize("D", [64, 13])
def test_c_chosen_score_backward_equals_the_sparse_reference(build_dir, compiling, D):
    torch.manual_seed(3)
    N, E, k = 50, 40, 6
    x = torch.randn(N, D, dtype=F64, requires_grad=True)
    weight = (0.3 * torch.randn(E, D, dtype=F64)).requires_grad_()
    scores = torch.sigmoid(x.detach() @ weight.detach().T)
    ids = torch.rand(N, E).argsort(-1)[:, :k]
    probe = [torch.randn(N, k, dtype=F64)]
    found = []
    for on in (True, False):
        compiled.enable(on)
        found.append(_grads(lambda a, b: [ChosenScores.apply(a, b, scores, ids)], [x, weight], probe))
    for name, a, b in zip(["chosen", "dx", "dweight"], *found):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0, msg=name)
    dense = _grads(lambda a, b: [torch.sigmoid(a @ b.T).gather(-1, ids)], [x, weight], probe)   # the definition
    for name, a, b in zip(["chosen", "dx", "dweight"], found[0], dense):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0, msg=name)


@needs_cc
@pytest.mark.parametrize("spread", [0.13, 3.0])
def test_c_selection_over_a_batch_of_router_rows_is_topk(build_dir, spread):
    """Rows like a router's (each row's floor guessed from the row before: too high, too low, or unusable)."""
    from tiny_k3.moe_native import top_k_ids_native
    torch.manual_seed(4)
    logits = torch.randn(600, 896) * spread + torch.randn(600, 1) * spread     # rows shifted up and down
    scores, bias = torch.sigmoid(logits), torch.randn(896) * 0.01
    assert torch.equal(top_k_ids_native(scores, bias, 16), (scores + bias).topk(16, dim=-1, sorted=True).indices)


# ------------------------------------------------------------------------------------------- the ctypes layer
def test_prototypes_are_read_from_the_sources():
    protos = native.prototypes(native.SOURCES["kda"].read_text())
    assert protos["kda_recurrent"] == ["long"] * 5 + ["ptr"] * 5 + ["REAL"] + ["ptr"] * 2
    assert set(native.prototypes(native.SOURCES["norm"].read_text())) == {"rms_norm_forward", "rms_norm_backward"}
    for source in native.SOURCES.values():
        assert native.prototypes(source.read_text()), f"{source.name} exports no `void name(...)` function"


@needs_cc
def test_a_call_with_the_wrong_number_of_arguments_is_refused_before_it_runs(build_dir):
    kernels = native.library(torch.float32, "norm")
    with pytest.raises(TypeError, match="rms_norm_forward takes 7 arguments, got 8"):
        kernels.rms_norm_forward(1, 1, 1e-6, 0, 0, 0, 0, 0)


def test_keep_freed_memory_takes_effect_on_glibc():
    from tiny_k3.fused import keep_freed_memory
    result = keep_freed_memory()
    assert isinstance(result, bool)
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert result, "mallopt refused the settings"


# ----------------------------------------------------------------------------------------------- SiTU-GLU
@needs_cc
@pytest.mark.parametrize("n", [8 * 37, 21])    # runs of 8, and a tail through the padded vector
def test_c_situ_glu_equals_situ_glu_outputs_and_gradients(build_dir, n):
    from tiny_k3.moe import situ_glu
    from tiny_k3.moe_native import SituGLU
    torch.manual_seed(5)
    scale = torch.logspace(-6, 2.5, n, dtype=F64)          # from where tanh(x) ~ x to both caps and past them
    g = (torch.randn(n, dtype=F64).sign() * scale).requires_grad_()
    u = (torch.randn(n, dtype=F64) * scale.flip(0)).requires_grad_()
    probe = [torch.randn(n, dtype=F64)]
    want = _grads(lambda a, b: [situ_glu(a, b, 4.0, 25.0)], [g, u], probe)
    got = _grads(lambda a, b: [SituGLU.apply(a, b, 4.0, 25.0)], [g, u], probe)
    for name, a, b in zip(["h", "dg", "du"], got, want):
        torch.testing.assert_close(a, b, atol=1e-13, rtol=1e-12, msg=name)   # relative too: tiny values keep digits


@needs_cc
@pytest.mark.parametrize("dtype, tol", [(F64, 1e-15), (torch.float32, 3e-7)])
def test_c_sigmoid_and_selection_in_one_pass(build_dir, dtype, tol):
    from tiny_k3.moe_native import sigmoid_top_k_ids_native
    torch.manual_seed(6)
    logits = torch.randn(300, 100, dtype=dtype) * 4
    logits[7, 3] = 200.0                                        # saturated both ways
    logits[8, 5] = -200.0
    bias = torch.randn(100, dtype=dtype) * 0.01
    scores = logits.clone()
    ids = sigmoid_top_k_ids_native(scores, bias, 8)
    torch.testing.assert_close(scores, torch.sigmoid(logits), atol=tol, rtol=tol)   # written in place
    assert torch.equal(ids, (scores + bias).topk(8, dim=-1, sorted=True).indices)   # of the scores it wrote
    with pytest.raises(ValueError, match="contiguous"):
        sigmoid_top_k_ids_native(logits.T, bias, 8)
