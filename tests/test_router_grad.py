"""The router's training path (tiny_k3/moe.py, `Router.forward` with autograd, `ChosenScores`) against the
full-width reference (`Router.full_width`), in float64: the same routing and, to float rounding, the same gradients.

The two paths compute the scores with the same product, so the ids they choose are compared exactly; the
gradients are other sums (k chosen entries per row, not all E), so they agree to TOL, not bit for bit.
"""

import copy

import pytest
import torch

from tiny_k3 import K3Config, TinyK3
from tiny_k3.data import corpus_rows
from tiny_k3.hooks import Hooks
from tiny_k3.moe import ChosenScores, LatentMoE, Router, chosen_weights, mixing_weights
from tiny_k3.train import adamw, lm_loss, train_step

from decisions import assert_decisive

F64 = torch.float64
TOL = 1e-10


def _router(E=48, D=12, k=5, renormalize=True, scaling=1.0, seed=0) -> Router:
    torch.manual_seed(seed)
    router = Router(D, E, k, renormalize=renormalize, scaling=scaling, dtype=F64)
    with torch.no_grad():
        router.weight.normal_(0, 0.5)                 # logits O(1): sigmoid' far from zero
        router.bias.normal_(0, 0.1)
    return router


def _routed_grads(route_fn, router: Router, x: torch.Tensor, probe: torch.Tensor):
    """(routing, dL/dx, dL/dW) for L = sum(weights * probe) under one of the router's two paths."""
    routing = route_fn(x)
    loss = (routing.weights * probe).sum()
    grads = torch.autograd.grad(loss, (x, router.weight))
    return routing, *grads


@pytest.mark.parametrize("renormalize, scaling, k", [(True, 1.0, 5), (False, 2.5, 5), (True, 2.5, 1)])
@pytest.mark.parametrize("hooks", [None, Hooks(blocked_experts={0: (3, 7)}), Hooks(forced_experts={0: (1, 9, 4)}),
                                   Hooks(unbiased=frozenset({0}))], ids=["plain", "blocked", "forced", "unbiased"])
def test_router_training_path_equals_the_full_width_reference(renormalize, scaling, k, hooks):
    router = _router(k=k, renormalize=renormalize, scaling=scaling)
    x = torch.randn(2, 9, 12, dtype=F64, requires_grad=True)
    k_out = len(hooks.forced_experts[0]) if hooks is not None and hooks.forced_experts else k
    probe = torch.randn(2, 9, k_out, dtype=F64)
    got, gx, gw = _routed_grads(lambda t: router(t, hooks, 0), router, x, probe)
    want, wx, ww = _routed_grads(lambda t: router.full_width(t, hooks, 0), router, x, probe)
    assert got.scores.requires_grad is False and want.scores.requires_grad is True
    assert_decisive(want.scores + router.bias, k, 1e-9)                 # no ties: the ids are one answer
    assert torch.equal(got.expert_ids, want.expert_ids)
    torch.testing.assert_close(got.scores, want.scores.detach(), atol=TOL, rtol=0)
    torch.testing.assert_close(got.weights, want.weights, atol=TOL, rtol=0)
    assert gw.abs().max() > 1e-3 and gx.abs().max() > 1e-3
    torch.testing.assert_close(gx, wx, atol=TOL, rtol=0)
    torch.testing.assert_close(gw, ww, atol=TOL, rtol=0)


def test_chosen_scores_gradients_pass_gradcheck_and_follow_which_inputs_need_them():
    router = _router(E=20, D=6, k=3)
    x = torch.randn(7, 6, dtype=F64, requires_grad=True)
    ids = torch.stack([torch.randperm(20)[:3] for _ in range(7)])        # [N, k] distinct per row

    def chosen(x, weight):   # the scores recomputed from x and W at every perturbation (not part of the graph)
        return ChosenScores.apply(x, weight, torch.sigmoid(x @ weight.T).detach(), ids)

    assert torch.autograd.gradcheck(chosen, (x, router.weight))
    scores = torch.sigmoid(x @ router.weight.T).detach()
    only_w = ChosenScores.apply(x.detach(), router.weight, scores, ids)
    (gw,) = torch.autograd.grad(only_w.sum(), (router.weight,))
    (gx,) = torch.autograd.grad(ChosenScores.apply(x, router.weight.detach(), scores, ids).sum(), (x,))
    assert torch.equal(only_w, scores.gather(-1, ids)), "the forward is the gather of the given scores"
    full = torch.sigmoid(x @ router.weight.T)
    want_x, want_w = torch.autograd.grad(full.gather(-1, ids).sum(), (x, router.weight))
    torch.testing.assert_close(gx, want_x, atol=TOL, rtol=0)
    torch.testing.assert_close(gw, want_w, atol=TOL, rtol=0)


def test_mixing_weights_renormalise_and_scale_the_chosen_scores():
    chosen = torch.tensor([[0.2, 0.6], [0.5, 0.5]], dtype=F64)
    torch.testing.assert_close(mixing_weights(chosen, True, 2.0), torch.tensor([[0.5, 1.5], [1.0, 1.0]], dtype=F64))
    torch.testing.assert_close(mixing_weights(chosen, False, 3.0), 3 * chosen)
    torch.testing.assert_close(mixing_weights(chosen[:, :1], True, 1.0), chosen[:, :1])   # k = 1 keeps its score
    scores = torch.rand(3, 10, dtype=F64)
    ids = torch.tensor([[1, 4], [0, 9], [2, 3]])
    assert torch.equal(chosen_weights(scores, ids, True, 1.5), mixing_weights(scores.gather(-1, ids), True, 1.5))


def _moe_config() -> K3Config:
    return K3Config.preset("tiny", num_experts=64, top_k=6)


def test_moe_training_forward_keeps_ids_load_and_output_and_gradients(monkeypatch):
    torch.manual_seed(1)
    moe = LatentMoE(_moe_config(), dtype=F64)
    reference = copy.deepcopy(moe)
    x = torch.randn(3, 11, moe.config.hidden_size, dtype=F64, requires_grad=True)
    out = moe(x)
    (gx,) = torch.autograd.grad(out.pow(2).sum(), (x,), retain_graph=True)
    out.pow(2).sum().backward()
    monkeypatch.setattr(Router, "forward", Router.full_width)
    want = reference(x)
    (wx,) = torch.autograd.grad(want.pow(2).sum(), (x,), retain_graph=True)
    want.pow(2).sum().backward()
    assert_decisive(reference.router.full_width(x).scores + reference.router.bias, 6, 1e-9)
    assert torch.equal(moe._last_ids, reference._last_ids)
    assert torch.equal(moe.last_load, reference.last_load) and moe.last_load.sum() == 3 * 11 * 6
    torch.testing.assert_close(out, want, atol=TOL, rtol=0)
    torch.testing.assert_close(gx, wx, atol=TOL, rtol=0)
    for (name, a), b in zip(moe.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=TOL, rtol=0, msg=name)


def test_a_training_step_with_the_chosen_scores_equals_one_with_the_full_width_router(monkeypatch):
    torch.manual_seed(0)
    sparse = TinyK3(K3Config.preset("tiny"), dtype=F64)
    full = copy.deepcopy(sparse)
    rows = corpus_rows(2, 24, seed=3)
    loss_sparse = lm_loss(sparse, rows)
    loss_sparse.backward()
    loads = [moe.last_load for moe in sparse.moe_layers()]
    with monkeypatch.context() as patch:
        patch.setattr(Router, "forward", Router.full_width)
        loss_full = lm_loss(full, rows)
        loss_full.backward()
        assert [torch.equal(a, moe.last_load) for a, moe in zip(loads, full.moe_layers())] == [True] * len(loads)
    torch.testing.assert_close(loss_sparse, loss_full, atol=TOL, rtol=0)
    routers = [name for name, _ in sparse.named_parameters() if name.endswith("router.weight")]
    assert routers and all(dict(sparse.named_parameters())[n].grad.abs().max() > 0 for n in routers)
    for (name, a), b in zip(sparse.named_parameters(), full.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=TOL, rtol=0, msg=name)
    for model in (sparse, full):      # and the whole step: clipping, AdamW, the router-bias update
        model.zero_grad(set_to_none=True)
    train_step(sparse, adamw(sparse, 1e-3, 0.1), rows, 1.0, True, 0)
    with monkeypatch.context() as patch:
        patch.setattr(Router, "forward", Router.full_width)
        train_step(full, adamw(full, 1e-3, 0.1), rows, 1.0, True, 0)
    for (name, a), b in zip(sparse.state_dict().items(), full.state_dict().values()):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0, msg=name)
