"""Starting the ranks: N processes on this machine (forkserver + a TCP rendezvous), or under torchrun.

Spawned ranks start from a forkserver (torch imported once) and talk over 127.0.0.1 only. A script that
calls `run_expert_parallel` needs the usual `if __name__ == "__main__":` guard; notebooks need nothing.
A rank that dies or hangs stops the others: the MoE collectives time out, and the parent ends any rank
still running once one has failed.
"""

from __future__ import annotations

import datetime
import os
import queue as queue_mod
import re
import socket
import sys
import time

import torch
import torch.distributed as dist

from tiny_k3.tokenizer import encode

from .traffic import EPRun
from .worker import check_run_inputs, ep_worker

SETUP_TIMEOUT = 60.0  # s for joining, the weight broadcast and the final gather; the MoE collectives get `timeout`
POLL_SECONDS = 0.1    # how often the parent looks at the result queue and the ranks' exit codes


class ParallelError(RuntimeError):
    """A distributed run that failed: a rank died, timed out or could not connect; the message says which."""


def describe_failure(exc: BaseException, timeout: float) -> str:
    """A collective's failure in one sentence."""
    text = str(exc)
    if "timed out" in text.lower() or "timeout" in text.lower():
        waited = re.search(r"(\d+)\s*ms", text)
        waited = int(waited.group(1)) / 1000 if waited else timeout
        return f"a collective timed out after {waited:g} s waiting for another rank (did one die or hang?)"
    if any(s in text for s in ("Connection reset", "Connection closed", "Broken pipe", "Connection refused")):
        return "lost the connection to another rank (it probably died)"
    if "address already in use" in text.lower() or "EADDRINUSE" in text:
        return "could not listen on the rendezvous port: address already in use"
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _spawn_entry(rank: int, world_size: int, init_method: str, backend: str, timeout: float, results, kwargs) -> None:
    """Process body in spawn mode: join the group, run, report to the parent through `results`."""
    torch.set_num_threads(1)  # N ranks share the machine's cores
    if sys.platform.startswith("linux") and backend == "gloo":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # single machine: keep gloo's pairs on loopback
    if backend == "nccl":
        torch.cuda.set_device(rank)
    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=max(timeout, SETUP_TIMEOUT)))
        run = ep_worker(rank, world_size, timeout=timeout, **kwargs)
        if rank == 0:
            results.put(("result", rank, run))
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one sentence
        results.put(("error", rank, describe_failure(exc, timeout)))
        sys.exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _check_port(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise ValueError(f"port {port} on 127.0.0.1 is already in use; pass another port "
                             "(or none, to pick a free one).") from None


def free_port() -> int:
    """A port the OS says is free right now on 127.0.0.1 (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context():
    """forkserver where the OS has it: one server imports torch (and this package) once and forks each rank
    from it, so N ranks do not pay N imports of torch (seconds each); plain spawn elsewhere (Windows)."""
    if "forkserver" in torch.multiprocessing.get_all_start_methods():
        ctx = torch.multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "numpy", "tiny_k3", "sim.parallel"])
        return ctx
    return torch.multiprocessing.get_context("spawn")


def run_expert_parallel(preset: str = "tiny", ranks: int = 2, sequences: list[list[int]] | None = None,
                        new_tokens: int = 0, *, seed: int = 0, dtype: str | None = None, device: str = "cpu",
                        check: bool = False, port: int | None = None, timeout: float = 30.0,
                        fail: tuple | None = None) -> EPRun:
    """Spawn `ranks` processes on this machine (gloo on CPU, NCCL with device="cuda") and run the model EP.

    sequences: token-id lists, dealt to the ranks in contiguous chunks (at least one per rank; one length per
    rank). `timeout` bounds every MoE collective (setup ones get SETUP_TIMEOUT), so a dead or stuck rank stops
    the others; once one rank failed, the parent gives the rest `timeout` + 1 s to report and ends any still
    running. `fail = (rank, step)` or (rank, step, "hang") is a drill: that rank dies (or stalls) at the start
    of that step (0 = prefill). `check` also runs the single-process model on each rank's sequences before
    sharding and reports the largest logit difference. Raises ValueError for bad input and ParallelError when
    a rank fails.
    """
    sequences = sequences if sequences is not None else [encode("expert parallel")] * ranks
    check_run_inputs(preset, ranks, sequences)
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    if backend == "nccl" and torch.cuda.device_count() < ranks:
        raise ValueError(f"NCCL needs one GPU per rank: {ranks} ranks but {torch.cuda.device_count()} GPUs here; "
                         "use device='cpu' (gloo) or fewer ranks.")
    if port is None:
        port = free_port()
    else:
        _check_port(port)
    kwargs = dict(preset=preset, sequences=sequences, new_tokens=new_tokens, seed=seed, dtype=dtype,
                  device="cuda" if backend == "nccl" else "cpu", check=check, fail=fail)  # cuda = cuda:rank
    ctx = _context()
    results = ctx.Queue()
    procs = [ctx.Process(target=_spawn_entry, daemon=True,
                         args=(r, ranks, f"tcp://127.0.0.1:{port}", backend, timeout, results, kwargs))
             for r in range(ranks)]
    for p in procs:
        p.start()
    try:
        run, messages = _collect(procs, results, timeout)
    finally:  # also on Ctrl-C in a notebook: no rank outlives the call
        _stop(procs)
    for r, p in enumerate(procs):
        if p.exitcode not in (0, None) and r not in messages:
            messages[r] = f"died (exit code {p.exitcode})"
    if messages or run is None:
        detail = "; ".join(f"rank {r}: {m}" for r, m in sorted(messages.items())) or "no result came back"
        raise ParallelError(f"the expert-parallel run on {ranks} ranks failed and every rank has stopped: {detail}.")
    return run


def _collect(procs: list, results, timeout: float) -> tuple[EPRun | None, dict[int, str]]:
    """Wait for rank 0's result and every rank's exit; (run or None, {rank: what went wrong})."""
    messages, run, give_up = {}, None, None
    while not (all(p.exitcode is not None for p in procs) and results.empty()):
        try:
            kind, rank, payload = results.get(timeout=POLL_SECONDS)
            if kind == "result":
                run = payload
            else:
                messages[rank] = payload
        except queue_mod.Empty:
            pass
        if give_up is None and (messages or any(p.exitcode not in (None, 0) for p in procs)):
            give_up = time.monotonic() + timeout + 1.0   # the rest fail within `timeout` or are stuck
        if give_up is not None and time.monotonic() > give_up:
            for r, p in enumerate(procs):
                if p.exitcode is None:
                    messages.setdefault(r, "still running after the others failed; stopped by the parent")
            break
    return run, messages


def _stop(procs: list) -> None:
    """End every rank still running: terminate, then kill what ignores it."""
    for p in procs:
        if p.exitcode is None:
            p.terminate()
            p.join(5)
        if p.exitcode is None:
            p.kill()
        p.join()


def run_under_torchrun(preset: str, ranks: int, sequences: list[list[int]], device: str, timeout: float,
                       common: dict) -> EPRun | None:
    """torchrun mode: the env:// rendezvous torchrun set up (RANK, WORLD_SIZE, MASTER_ADDR/PORT, LOCAL_RANK).
    Returns the EPRun on rank 0, None on the others."""
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", ranks))))
    check_run_inputs(preset, ranks, sequences)
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=max(timeout, SETUP_TIMEOUT)))
    try:
        return ep_worker(rank, ranks, preset, sequences, device=f"cuda:{local}" if backend == "nccl" else "cpu",
                         timeout=timeout, **common)
    except RuntimeError as exc:
        raise ParallelError(f"rank {rank}: {describe_failure(exc, timeout)}.") from None
    finally:
        dist.destroy_process_group()
