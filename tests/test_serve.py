"""`serve` leaves nothing behind (issue 24): dev.py passes termination on to the server, and an app whose browser
connection drops without a close, or that gets SIGTERM, exits within seconds. Loopback only (127.0.0.1); every
wait is bounded; only processes these tests started are signalled."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tui_app import serve

ROOT = Path(__file__).resolve().parents[1]
TUI_OPTIONS = ["--", "--preset", "tiny", "--weights", "random"]
START = 600          # seconds for a server or an app to start on a loaded machine (generous; not a timing test)
GONE = serve.QUIT_GRACE * 2 + 10   # an app asked to quit, terminated, killed: the most its end may take

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the app's pid"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _children(pid: int) -> list[int]:
    """The live (not zombie) child processes of pid, from /proc."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return [c for c in out if _alive(c)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _wait(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


async def _open_tab(port: int):
    """A browser tab: the page, then the websocket, read until the first screen shows -> (session, ws)."""
    import aiohttp   # noqa: PLC0415 - comes with the optional serve extra

    session = aiohttp.ClientSession()
    deadline = time.monotonic() + START
    while True:
        try:
            async with session.get(f"http://127.0.0.1:{port}/") as page:
                assert page.status == 200
            break
        except aiohttp.ClientConnectionError:
            assert time.monotonic() < deadline, "the server did not start"
            await asyncio.sleep(0.2)
    ws = await session.ws_connect(f"http://127.0.0.1:{port}/ws?width=100&height=30")
    seen = b""
    while b"Tokens" not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no first screen; got {seen[-300:]!r}"
        msg = await ws.receive(timeout=left)
        assert msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT), msg
        seen += msg.data if isinstance(msg.data, bytes) else msg.data.encode()
    return session, ws


def _server(port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tui_app.serve", "--host", "127.0.0.1", "--port", str(port),
                             *TUI_OPTIONS], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(process: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    if process.poll() is None:
        process.send_signal(sig)
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=60)
        raise AssertionError(f"pid {process.pid} did not stop on signal {sig}") from None


def test_an_app_exits_when_its_connection_drops_without_a_close_and_on_sigterm():
    pytest.importorskip("textual_serve")
    port = _free_port()
    server = _server(port)
    apps: list[int] = []
    try:
        async def drop_then_terminate():
            session, ws = await _open_tab(port)
            (app,) = _children(server.pid)                              # no shell between: the app itself
            apps.append(app)
            argv = Path(f"/proc/{app}/cmdline").read_bytes().decode().split("\0")
            assert argv[0] == sys.executable and str(serve.TUI) in argv      # not a shell around it
            ws._response.connection.transport.abort()                   # gone, as a killed browser goes: no close
            await session.close()
            _wait(lambda: not _alive(app), GONE, "the app outlived its dropped connection")
            session, ws = await _open_tab(port)                        # a second tab; its app gets SIGTERM
            (app,) = _children(server.pid)
            apps.append(app)
            os.kill(app, signal.SIGTERM)
            _wait(lambda: not _alive(app), GONE, "the app ignored SIGTERM")
            await session.close()

        asyncio.run(drop_then_terminate())
        assert server.poll() is None and len(set(apps)) == 2             # the server serves on
    finally:
        code = _stop(server)
    assert code == 0 and not any(_alive(a) for a in apps) and _port_is_free(port)


def test_the_server_stops_its_apps_and_dev_py_passes_termination_on():
    pytest.importorskip("textual_serve")
    port = _free_port()
    # dev.py's serve, without its set-up step (no .venv here): run_forwarding around the server
    parent = subprocess.Popen([sys.executable, "-c", "import sys, dev; sys.exit(dev.run_forwarding(sys.argv[1:]))",
                               sys.executable, "-m", "tui_app.serve", "--host", "127.0.0.1", "--port", str(port),
                               *TUI_OPTIONS], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async def open_and_keep():
            session, _ = await _open_tab(port)
            (server,) = _children(parent.pid)
            (app,) = _children(server)
            return session, server, app

        loop = asyncio.new_event_loop()
        session, server, app = loop.run_until_complete(open_and_keep())   # the tab stays open
        assert not _port_is_free(port)
        code = _stop(parent)                                             # stopped by its pid, as a user would
        _wait(lambda: not _alive(server) and not _alive(app), GONE, "the server or its app outlived dev.py")
        loop.run_until_complete(session.close())
        loop.close()
    finally:
        _stop(parent, signal.SIGKILL)
    assert code in (0, -signal.SIGTERM, 128 + signal.SIGTERM) and _port_is_free(port)


def test_the_served_command_is_this_tui_under_the_guard_and_app_mode_runs_only_it(capsys):
    cmd = serve.command(["--preset", "tiny"])
    assert cmd.endswith("tui.py --preset tiny") and f"-m tui_app.serve {serve.APP_FLAG} " in cmd
    assert serve.main([serve.APP_FLAG, "/elsewhere/tui.py"]) == 2
    assert "runs" in capsys.readouterr().err
