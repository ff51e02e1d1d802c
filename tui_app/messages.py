"""How the app's jobs run and report: one driver job per thread worker, its progress and its end as messages.

A job is a plain function of the Driver (`run_load`, `run_step`, `run_what_if`, `run_recall`, a save) run
in a Textual thread worker (`TinyK3App.run_job`). It never raises into the worker: `run_job` turns how it
ended into a JobOutcome, and the worker posts it back to the UI thread as JobFinished, with the app method
that takes it. Progress on the way (a prefill's tokens, a what-if's) comes back as JobProgress.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, NamedTuple

from textual.message import Message

from .driver import Cancelled

WORKER_THREAD = "tiny-k3-worker"    # name prefix of the worker threads (tui_app.cli waits for them on exit)


class JobOutcome(NamedTuple):
    """How a driver job run in a worker thread ended: its value, or one sentence, or cancelled."""

    value: object = None
    error: str | None = None
    cancelled: bool = False


def run_job(job: Callable[[], object]) -> JobOutcome:
    """Run job(); a ValueError keeps its own sentence, any other exception is named (shown in the status
    line, never a crash of the interface), Cancelled is cancelled."""
    try:
        return JobOutcome(job())
    except Cancelled:
        return JobOutcome(cancelled=True)
    except ValueError as exc:
        return JobOutcome(error=str(exc))
    except Exception as exc:  # noqa: BLE001
        return JobOutcome(error=f"{type(exc).__name__}: {exc}")


@dataclass
class JobProgress(Message):
    """A running job's progress (a driver.Progress), for `then` on the UI thread."""

    progress: object
    then: Callable[[object], None]


@dataclass
class JobFinished(Message):
    """A job's end, for `then` on the UI thread (which drops it when it is stale: the driver knows)."""

    outcome: JobOutcome
    then: Callable[[JobOutcome], None]


class WorkerPool(ThreadPoolExecutor):
    """The workers' thread pool. Its shutdown does not wait: quitting must not wait for a token in flight
    (the jobs stop at their next cancel check; tui_app.cli gives them a moment, then exits anyway)."""

    def __init__(self) -> None:
        super().__init__(max_workers=4, thread_name_prefix=WORKER_THREAD)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=True)
