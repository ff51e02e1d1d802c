"""Expert parallelism for real: TinyK3's routed experts spread over N processes, tokens moved by all_to_all.

K3 is served on 64+ GPUs with each GPU holding E/EP of every MoE layer's experts (k3_facts.md §6a). This runs
the same scheme on one machine (or several) with PyTorch's own engine, torch.distributed: gloo on CPU, NCCL on
GPUs. Every rank holds

    replicated  embedding, attention (KDA/MLA), AttnRes, the router, the latent down/up projections and norm,
                the shared experts, the head
    sharded     routed experts rank*E/N .. (rank+1)*E/N - 1 of every MoE layer (w1, w3 [E/N, m, l], w2 [E/N, l, m])

so the output equals the single-process model for the same weights, up to float summation order. One file
per idea:

    sharded.py   ExpertParallelMoE: LatentMoE with a slice of the experts and two all_to_alls (the math)
    traffic.py   RankTraffic -> LayerTraffic per (step, layer), EPRun: what a run moved, as plain data
    worker.py    one rank's run: build, shard, serve its sequences, gather on rank 0
    launch.py    run_expert_parallel (spawns N local processes) and the torchrun mode; failures as one sentence
    report.py    measured vs analytic (sim.costs: the same quantities for the real K3 on 64 GPUs, §6b)
    cli.py       `python -m sim.parallel`

Run it:

    python -m sim.parallel --preset tiny --ranks 4 --prompt "key=7; 3+4=" --prompt "hello"   # spawns 4 processes
    torchrun --standalone --nproc-per-node 4 -m sim.parallel --preset tiny --prompt "hello"   # torchrun, 1 machine
    # several machines (run on each, NODE = 0, 1, ...; HOST = node 0's address; add --device cuda for NCCL):
    torchrun --nnodes 2 --nproc-per-node 4 --node-rank NODE --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m sim.parallel --preset tiny --prompt "hello"
    # if gloo picks the wrong network card across machines: GLOO_SOCKET_IFNAME=eth0 (NCCL: NCCL_SOCKET_IFNAME)
    python -m sim.parallel --ranks 2 --fail-rank 1 --fail-step 1 [--hang] --timeout 5   # drill: a rank dies
"""

from .cli import main
from .launch import ParallelError, free_port, run_expert_parallel, run_under_torchrun
from .report import comparison, print_report
from .sharded import META_BYTES, ExpertParallelMoE, expert_range, plan_dispatch, set_step, shard_model
from .traffic import EPRun, LayerTraffic, RankTraffic, assemble_traffic
from .worker import build_model, check_run_inputs, ep_worker, rank_sequences, serve

__all__ = ["ExpertParallelMoE", "expert_range", "plan_dispatch", "shard_model", "set_step", "META_BYTES",
           "RankTraffic", "LayerTraffic", "assemble_traffic", "EPRun", "build_model", "rank_sequences",
           "check_run_inputs", "serve", "ep_worker", "run_expert_parallel", "run_under_torchrun", "free_port",
           "ParallelError", "comparison", "print_report", "main"]
