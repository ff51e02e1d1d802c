"""The TUI's command line: `tiny-k3 [--preset small] [--prompt TEXT] [--seed 0] [--weights auto] [--device cpu]
[--open RUN.npz]` checked, then the app run (the top-level `tui` module and `tiny-k3` call `main`).

Every bad value is one sentence and exit status 2, before anything starts.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from sim import runfile
from sim.presets import (COUNTED_ONLY, DEFAULT_PRESET, DEFAULT_PROMPT, check_device, config_for, has_checkpoint,
                         tui_presets)
from sim.prompt import prompt_ids
from sim.threads import use_free_cores

from .app import TinyK3App
from .messages import WORKER_THREAD

DESCRIPTION = "tiny-k3: step through generation and watch MoE routing, the KDA state, the cache and AttnRes."
EXIT_GRACE = 0.5   # seconds a job may take to reach its next cancel check after q, before the process exits anyway


class UsageError(Exception):
    """A bad command-line value: one sentence."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):   # argparse's own errors, as one sentence (no usage block)
        raise UsageError(message[0].upper() + message[1:].rstrip(".") + "; see --help.")


def _sentence(exc: Exception) -> str:
    """A library's error (lower case, for the middle of a line) as the start of the CLI's line."""
    text = str(exc)
    return text[:1].upper() + text[1:]


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"the seed must be a whole number, 0 or more, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"the seed must be 0 or more, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: raises UsageError with one sentence naming the value and what is allowed."""
    presets = tui_presets()
    parser = _Parser(prog="tiny-k3", description=DESCRIPTION)
    parser.add_argument("--preset", default=DEFAULT_PRESET, help=f"one of: {', '.join(presets)}")
    parser.add_argument("--prompt", default=None, help="the text to start from (default: a short example)")
    parser.add_argument("--seed", type=_seed, default=0, help="seed of random init and sampling (0 or more)")
    parser.add_argument("--weights", default="auto", choices=("auto", "trained", "random"),
                        help="auto: the shipped trained weights where a preset has them")
    parser.add_argument("--device", default=None, help="cpu (default) or cuda; also $TINY_K3_DEVICE")
    parser.add_argument("--open", dest="open_path", default=None, metavar="RUN", help="reopen a saved run")
    args = parser.parse_args(argv)
    if args.preset in COUNTED_ONLY:
        raise UsageError(f"Preset {args.preset!r} is a full-size model, only counted, never run; "
                         f"pick one of: {', '.join(presets)}.")
    if args.preset not in presets:
        raise UsageError(f"Unknown preset {args.preset!r}; valid presets are: {', '.join(presets)}.")
    if args.weights == "trained" and args.open_path is None and not has_checkpoint(args.preset):
        shipped = [name for name in presets if has_checkpoint(name)]
        raise UsageError(f"No trained weights ship for preset {args.preset!r} (presets with them: "
                         f"{', '.join(shipped) or 'none'}); use --weights auto or --weights random.")
    args.prompt = DEFAULT_PROMPT if args.prompt is None else args.prompt
    try:
        prompt_ids(args.prompt, config_for(args.preset))       # the Simulation's own check, its own words
        check_device(args.device)
    except ValueError as exc:
        raise UsageError(_sentence(exc)) from None
    if args.open_path is not None:
        try:
            runfile.read(args.open_path)
        except ValueError as exc:
            raise UsageError(f"Cannot open the run: {exc}") from None
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except UsageError as exc:
        print(f"tiny-k3: {exc}", file=sys.stderr)
        return 2
    use_free_cores()             # a busy machine: torch threads without a core would stall every op (sim/threads.py)
    app = TinyK3App(args.preset, args.prompt, args.seed, args.device, weights=args.weights,
                    open_path=args.open_path)
    app.run()
    _exit_promptly(app.return_code or 0)
    return app.return_code or 0


def _exit_promptly(code: int) -> None:
    """q means quit now: give a job in flight EXIT_GRACE to stop at its cancel check, then leave anyway
    (a k3-topo token or model build can take longer; the interpreter would otherwise wait for it)."""
    deadline = time.monotonic() + EXIT_GRACE
    for thread in threading.enumerate():
        if thread.name.startswith(WORKER_THREAD):
            thread.join(max(0.0, deadline - time.monotonic()))
    if any(t.name.startswith(WORKER_THREAD) and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
