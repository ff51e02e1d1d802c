"""The TUI in a browser, for a projector: `python -m tui_app.serve [--host H] [--port P] [-- TUI OPTIONS]`.

textual-serve (the optional `serve` extra) serves a page that runs one tui.py per browser tab, on this
machine; nothing leaves it unless --host says so. Ctrl+C stops the server and its apps.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

TUI = Path(__file__).resolve().parents[1] / "tui.py"


def command(tui_args: list[str]) -> str:
    """The shell command textual-serve runs per browser tab: this Python, tui.py, the TUI's options."""
    return shlex.join([sys.executable, str(TUI), *tui_args])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tiny-k3 serve", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="localhost", help="interface to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("tui_args", nargs=argparse.REMAINDER, help="options for the TUI, after --")
    args = parser.parse_args(argv)
    try:
        from textual_serve.server import Server   # noqa: PLC0415 - an optional extra: only this command needs it
    except ModuleNotFoundError:
        print("tiny-k3 serve: textual-serve is not installed; `python3 dev.py serve` installs it "
              "(or: pip install 'tiny-k3[serve]').", file=sys.stderr)
        return 2
    rest = args.tui_args[1:] if args.tui_args[:1] == ["--"] else args.tui_args
    print(f"tiny-k3 in a browser: open http://{args.host}:{args.port} (Ctrl+C stops)", flush=True)
    Server(command(rest), host=args.host, port=args.port, title="tiny-k3").serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
