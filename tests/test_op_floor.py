"""bench/op_floor.py: the recorder sees the ops a call runs, and the replay times them on faithful copies."""

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))

from op_floor import _copy, _written, record_ops, replay_floor  # noqa: E402


def _call(a, b, out):
    torch.bmm(a, b, out=out)
    out.mul_(0.5)
    return out.view(-1).sum()


def test_the_recorder_keeps_the_data_ops_in_order_and_leaves_views_out():
    a, b, out = torch.randn(3, 4, 5), torch.randn(3, 5, 2), torch.empty(3, 4, 2)
    names = [op.name for op in record_ops(lambda: _call(a, b, out))]
    assert names == ["aten.bmm.out", "aten.mul_.Tensor", "aten.sum.default"], (
        f"expected the three data ops of _call in order, without the view; got {names}")


def test_recorded_arguments_are_copies_that_keep_shape_strides_and_values():
    x = torch.randn(2, 8, 6)
    view = x.permute(0, 2, 1)[:, 1:4]                      # strided, inside a larger storage
    copy = _copy(view)
    assert copy.shape == view.shape and copy.stride() == view.stride() and torch.equal(copy, view)
    assert copy.untyped_storage().data_ptr() != x.untyped_storage().data_ptr(), "a copy must not alias the call's data"
    broadcast = torch.randn(4, 1).expand(4, 5)
    kept = _copy(broadcast)
    assert kept.stride() == broadcast.stride() and torch.equal(kept, broadcast), "a stride-0 dimension stays broadcast"


def test_the_replay_restores_what_an_op_writes_so_each_run_sees_the_recorded_inputs():
    s = torch.full((16,), 2.0)
    ops = record_ops(lambda: s.mul_(1e-30))
    (op,) = ops
    assert [arg is op.args[0] for arg, _ in _written(op)] == [True], "mul_ writes its first argument"
    replay_floor(ops, repeats=40)
    # without the restore, 40 runs would take 2.0 * 1e-30**40 to zero; restored, the last run started from 2.0
    assert torch.equal(op.args[0], torch.full((16,), 2e-30)), op.args[0]


def test_the_floor_adds_up_its_ops_and_ranks_them():
    a, b, out = torch.randn(64, 64, 64), torch.randn(64, 64, 64), torch.empty(64, 64, 64)
    floor = replay_floor(record_ops(lambda: _call(a, b, out)))
    assert abs(floor.total_ms - sum(ms for _, _, ms in floor.by_op)) < 1e-9
    assert [calls for _, calls, _ in floor.by_op] == [1, 1, 1]
    assert [ms for _, _, ms in floor.by_op] == sorted((ms for _, _, ms in floor.by_op), reverse=True)
    assert all(ms > 0 for _, _, ms in floor.by_op)
