"""Expert parallelism over real torch.distributed processes (gloo on CPU): the sim/parallel package.

The ranks run in forked processes; one run per rank count is shared by the tests below (module fixtures).
"""

import socket

import numpy as np
import pytest
import torch

from sim import parallel as P
from sim import costs
from sim.costs import expected_destinations
from tiny_k3 import K3Config, TraceRecorder

from decisions import assert_decisive

CFG = K3Config.preset("tiny")
NEW_TOKENS = 3
SEQUENCES = torch.randint(0, 256, (4, 9), generator=torch.Generator().manual_seed(1)).tolist()


@pytest.fixture(scope="module")
def reference():
    """The single-process model on all 4 sequences at once: step logits, greedy tokens, routing of every MoE call."""
    model, rec = P.build_model("tiny", seed=0, dtype=torch.float64), TraceRecorder()
    with torch.no_grad():
        logits, cache = model(torch.tensor(SEQUENCES), recorder=rec)
        prefill, last, out = logits, [logits[:, -1]], []
        for _ in range(NEW_TOKENS - 1):
            out.append(logits[:, -1].argmax(-1))
            logits, cache = model(out[-1][:, None], cache, recorder=rec)
            last.append(logits[:, -1])
        out.append(logits[:, -1].argmax(-1))
    routing = [data["expert_ids"].reshape(len(SEQUENCES), -1, CFG.top_k).numpy() for _, data in rec.of("moe")]
    # The ranks compute these from differently batched products (logits agree to 1e-10, not bit for bit): the
    # greedy tokens and the expert ids they carry are compared exactly below, so each must be decided by more.
    for step_logits in last:
        assert_decisive(step_logits, 1, 1e-8)
    for _, data in rec.of("moe"):
        assert_decisive(data["scores"] + data["bias"], CFG.top_k, 1e-8)
    return dict(prefill=prefill.numpy(), last=torch.stack(last).numpy(), tokens=torch.stack(out, 1).numpy(),
                routing=routing)


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def run(request):
    return P.run_expert_parallel("tiny", request.param, SEQUENCES, NEW_TOKENS, dtype="float64", timeout=30)


def test_expert_parallel_output_equals_single_process(run, reference):
    assert run.backend == "gloo" and run.ranks_of == sorted(run.ranks_of) and len(set(run.ranks_of)) == run.world_size
    np.testing.assert_allclose(np.stack(run.logits), reference["prefill"], rtol=0, atol=1e-10)
    np.testing.assert_allclose(run.step_logits, reference["last"], rtol=0, atol=1e-10)   # every decode step too
    np.testing.assert_array_equal(run.generated, reference["tokens"])


def test_traffic_counts_equal_what_the_routing_implies(run, reference):
    N, per = run.world_size, CFG.num_experts // run.world_size
    moe_layers = CFG.moe_layers
    assert len(run.traffic) == NEW_TOKENS * len(moe_layers) == len(reference["routing"])
    chunks = P.rank_sequences(len(SEQUENCES), N)
    row, meta = CFG.latent_dim * 8, 2 * CFG.top_k * 8                   # float64 latent row, float64 ids + weights
    for i, (traffic, ids) in enumerate(zip(run.traffic, reference["routing"])):
        assert (traffic.step, traffic.layer) == (i // len(moe_layers), moe_layers[i % len(moe_layers)])
        pairs, copies, distinct = np.zeros((N, N), int), np.zeros((N, N), int), np.zeros(N + 1, int)
        for src, chunk in enumerate(chunks):
            dest = ids[list(chunk)].reshape(-1, CFG.top_k) // per     # [tokens of src, k] rank of each expert
            pairs[src] = np.bincount(dest.ravel(), minlength=N)
            hit = np.zeros((len(dest), N), bool)
            np.put_along_axis(hit, dest, True, axis=1)
            copies[src] = hit.sum(0)
            distinct += np.bincount(hit.sum(1), minlength=N + 1)
        np.testing.assert_array_equal(traffic.pairs, pairs)
        np.testing.assert_array_equal(traffic.copies, copies)
        np.testing.assert_array_equal(traffic.distinct, distinct)
        np.testing.assert_array_equal(traffic.dispatch_bytes, copies * (row + meta))
        np.testing.assert_array_equal(traffic.combine_bytes, copies.T * row)  # results go back where they came from
        tokens_per_rank = [len(c) * (ids.shape[1]) for c in chunks]
        np.testing.assert_array_equal(traffic.tokens, tokens_per_rank)
        assert traffic.load.sum() == CFG.top_k * sum(tokens_per_rank)
        assert traffic.destinations == pytest.approx(copies.sum() / sum(tokens_per_rank))
        assert traffic.imbalance == pytest.approx(traffic.load.max() * N / traffic.load.sum())


def test_stats_and_comparison_are_plain_data(run):
    stats = run.stats()
    assert len(stats) == len(run.traffic) and isinstance(stats[0]["copies"], np.ndarray)
    assert stats[0]["copies"].shape == (run.world_size, run.world_size)
    np.testing.assert_array_equal(run.step_matrix(0, "copies"), sum(s["copies"] for s in stats if s["step"] == 0))
    rows = {r["quantity"].split(" (")[0]: r for r in P.comparison(run)}
    dest = rows["distinct ranks per token"]
    assert dest["tiny"] == pytest.approx(expected_destinations(run.world_size, CFG.top_k))
    assert 1 <= dest["measured"] <= min(run.world_size, CFG.top_k)
    assert dest["k3"] == pytest.approx(expected_destinations(64, 16))
    assert rows["cross-rank share of copies"]["tiny"] == pytest.approx(1 - 1 / run.world_size)
    assert rows["busiest / mean rank load"]["measured"] >= 1.0


def test_k3_expert_parallel_figures():
    k3 = costs.k3_ep_figures(64)
    assert k3["experts_per_gpu"] == 14 and k3["latent_dim"] == 3584 and k3["moe_layers"] == 92
    assert round(k3["destinations"], 1) == 14.3                                 # of 16 (k3_facts.md §6b)
    assert k3["dispatch_per_copy"] == 16 * (3584 + 112) == 59_136               # 59.1 KB: FP8 + one scale per 32
    assert k3["combine_per_copy"] == 16 * 3584 * 2 == 114_688                   # 114.7 KB: BF16
    assert round(k3["per_token_step_per_copy"] / 1e6, 1) == 16.0                # x 92 layers
    assert k3["dispatch_per_destination"] == pytest.approx(k3["destinations"] * 3696)
    for batch, expected in ((16, 2.34), (128, 1.42), (1024, 1.15)):            # Monte-Carlo figures of §6b
        assert k3["imbalance"][batch] == pytest.approx(expected, abs=0.05)
    assert costs.load_imbalance(896, 16, 64, 16, samples=1 << 12) > costs.load_imbalance(896, 16, 64, 1024, samples=1 << 12)
    assert costs.load_imbalance(112, 2, 1, 8) == 1.0                                 # one rank: nothing to imbalance


def test_ranks_must_divide_the_experts():
    with pytest.raises(ValueError, match=r"3 ranks do not divide the 112 experts evenly; use one of 1, 2, 4, 7, 8"):
        P.run_expert_parallel("tiny", 3, SEQUENCES[:3])
    with pytest.raises(ValueError, match="3 sequences cannot feed 4 ranks"):
        P.run_expert_parallel("tiny", 4, SEQUENCES[:3])
    with pytest.raises(ValueError, match="of one length"):
        P.run_expert_parallel("tiny", 2, [[1, 2], [1, 2, 3], [4], [5]])
    with pytest.raises(ValueError, match="only counted, never run"):
        P.build_model("k3")


def test_port_in_use_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match=f"port {port} on 127.0.0.1 is already in use"):
            P.run_expert_parallel("tiny", 2, SEQUENCES[:2], port=port)


def test_a_dying_rank_stops_the_others():
    with pytest.raises(P.ParallelError) as err:
        P.run_expert_parallel("tiny", 2, SEQUENCES[:2], new_tokens=3, fail=(1, 1), timeout=20)
    message = str(err.value)
    assert "rank 1: died (exit code 3)" in message
    assert "rank 0: lost the connection to another rank" in message


def test_a_hanging_rank_times_out_the_collectives():
    with pytest.raises(P.ParallelError) as err:
        P.run_expert_parallel("tiny", 2, SEQUENCES[:2], new_tokens=2, fail=(0, 1, "hang"), timeout=2)
    message = str(err.value)
    assert "rank 1: a collective timed out after 2 s" in message
    assert "rank 0: still running after the others failed; stopped by the parent" in message


def test_cli_prints_the_tables(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "150")
    assert P.main(["--ranks", "2", "--tokens", "2", "--prompt", "hi there", "--prompt", "ok"]) == 0
    out = capsys.readouterr().out
    for text in ("measured per step and MoE layer", "from \\ to", "K3 EP64", "distinct ranks per token",
                 "generated tokens equal", "rank 1: 'ok'"):
        assert text in out
    assert P.main(["--ranks", "3"]) == 1
    assert "3 ranks do not divide the 112 experts" in capsys.readouterr().out
