"""The TUI in a browser, for a projector: `python -m tui_app.serve [--host H] [--port P] [-- TUI OPTIONS]`.

textual-serve (the optional `serve` extra) serves a page that runs one tui.py per browser tab, on this
machine; nothing leaves it unless --host says so. Ctrl+C (or SIGTERM) stops the server and its apps.

No app outlives its tab or the server (issue 24: a browser that dropped its connection abruptly could leave
its app spinning, deaf to SIGTERM). Three guards:
- the server starts each app without a shell (its pid is the app's), and when the tab's connection ends,
  cleanly or not, it asks the app to quit, then after QUIT_GRACE seconds terminates it, then kills it;
- the server's own stop ends every app it started the same way;
- each app runs under `app_main`, which takes SIGTERM and SIGHUP on a thread of its own (so a busy or
  blocked event loop cannot hide them), notices the server gone (parent death), and then leaves: Textual's
  own exit first, and after QUIT_GRACE seconds the process exits anyway.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

TUI = Path(__file__).resolve().parents[1] / "tui.py"
QUIT_GRACE = 3.0          # seconds an app has to quit once asked, before it is terminated (then killed)
APP_FLAG = "--app"        # `python -m tui_app.serve --app PATH/tui.py TUI OPTIONS`: one tab's app (app_main)
WATCH_SIGNALS = {signal.SIGTERM, signal.SIGHUP} if hasattr(signal, "SIGHUP") else {signal.SIGTERM}


def command(tui_args: list[str]) -> str:
    """The command the server runs per browser tab: this Python, this module's app mode, tui.py, its options."""
    return shlex.join([sys.executable, "-m", "tui_app.serve", APP_FLAG, str(TUI), *tui_args])


# ---------------------------------------------------------------------------- one tab's app


def app_main(tui_args: list[str]) -> int:
    """Run tui.py's main for one browser tab, leaving within QUIT_GRACE seconds of a SIGTERM or SIGHUP, or of
    the server's end (its parent gone), whatever the app is doing."""
    if hasattr(signal, "pthread_sigmask"):
        # Blocked here, before any thread starts, so every thread inherits the mask and only the watcher's
        # sigtimedwait takes these signals (the event loop's handlers cannot run while it is blocked).
        signal.pthread_sigmask(signal.SIG_BLOCK, WATCH_SIGNALS)
        _die_with_parent(signal.SIGTERM)
        threading.Thread(target=_watch, args=(os.getppid(),), name="tiny-k3-serve-watch", daemon=True).start()
    import tui   # noqa: PLC0415 - the TUI's imports (torch, textual) only in the app's process

    return tui.main(tui_args)


def _die_with_parent(sig: int) -> None:
    """Linux: ask the kernel to send `sig` to this process when its parent (the server) dies. Elsewhere the
    watcher's poll of the parent's pid does it, within half a second."""
    if sys.platform.startswith("linux"):
        import ctypes   # noqa: PLC0415

        PR_SET_PDEATHSIG = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError):
            pass


def _watch(parent: int, poll: float = 0.5) -> None:
    """[thread] Wait for a watched signal or the parent's end, then ask the app to quit (SIGINT: Textual's
    handler exits the app) and leave after QUIT_GRACE seconds if it has not."""
    got = None
    while got is None and os.getppid() == parent:
        got = signal.sigtimedwait(WATCH_SIGNALS, poll)
    code = 128 + (got.si_signo if got is not None else signal.SIGHUP)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(QUIT_GRACE)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


# ---------------------------------------------------------------------------- the server


async def stop_process(process, grace: float = QUIT_GRACE) -> int:
    """Wait up to `grace` seconds for an asyncio subprocess to end, then terminate it and wait as long, then
    kill it; returns its exit status."""
    for signal_it in (None, process.terminate, process.kill):
        if process.returncode is not None:
            break
        if signal_it is not None:
            try:
                signal_it()
            except ProcessLookupError:
                break
        try:
            await asyncio.wait_for(process.wait(), grace)
        except asyncio.TimeoutError:
            continue
    return await process.wait()


def _server_classes():
    """(GuardedAppService, GuardedServer): textual-serve's classes with the guards of the module docstring."""
    from textual_serve.app_service import AppService   # noqa: PLC0415 - an optional extra
    from textual_serve.server import Server   # noqa: PLC0415

    class GuardedAppService(AppService):
        live: set = set()     # every app service whose process may still run (the server's stop ends them)

        async def _open_app_process(self, width: int = 80, height: int = 24):
            # exec, not a shell: the pid the server holds is the app's, so its signals reach the app
            self._process = process = await asyncio.create_subprocess_exec(
                *shlex.split(self.command), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=self._build_environment(width=width, height=height))
            self._stdin = process.stdin
            GuardedAppService.live.add(self)
            return process

        async def stop(self) -> None:
            """Ask the app to quit (textual-serve's own stop, bounded), then terminate, then kill it."""
            process = self._process
            if self._task is not None:
                try:
                    await asyncio.wait_for(super().stop(), QUIT_GRACE)
                except (asyncio.TimeoutError, ConnectionError, RuntimeError):
                    pass
                self._task = None
            if process is not None:
                await stop_process(process)
            GuardedAppService.live.discard(self)

    # Server.handle_websocket builds its AppService by this module-level name (textual-serve 1.1): ours instead
    import textual_serve.server as server_module   # noqa: PLC0415

    server_module.AppService = GuardedAppService

    class GuardedServer(Server):
        async def on_shutdown(self, app) -> None:
            await asyncio.gather(*(service.stop() for service in list(GuardedAppService.live)),
                                 return_exceptions=True)

    return GuardedAppService, GuardedServer


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [APP_FLAG]:                       # one tab's app: `--app PATH/tui.py TUI OPTIONS`
        if argv[1:2] != [str(TUI)]:
            print(f"tiny-k3 serve: {APP_FLAG} runs {TUI} only, got {argv[1:2]}.", file=sys.stderr)
            return 2
        return app_main(argv[2:])
    parser = argparse.ArgumentParser(prog="tiny-k3 serve", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="localhost", help="interface to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("tui_args", nargs=argparse.REMAINDER, help="options for the TUI, after --")
    args = parser.parse_args(argv)
    try:
        _, GuardedServer = _server_classes()
    except ModuleNotFoundError:
        print("tiny-k3 serve: textual-serve is not installed; `python3 dev.py serve` installs it "
              "(or: pip install 'tiny-k3[serve]').", file=sys.stderr)
        return 2
    rest = args.tui_args[1:] if args.tui_args[:1] == ["--"] else args.tui_args
    print(f"tiny-k3 in a browser: open http://{args.host}:{args.port} (Ctrl+C stops)", flush=True)
    GuardedServer(command(rest), host=args.host, port=args.port, title="tiny-k3").serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
