"""The TUI's command line and packaging: bad values are one sentence before anything starts, a Python
without the project's packages is told what to run, the wheel ships the stylesheet, and `serve` shows
the first screen in a browser's websocket and stops cleanly."""

import asyncio
import re
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

import tui
from tui_app import serve

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv, says", [
    (["--seed", "-1"], "the seed must be 0 or more, got -1"),
    (["--seed", "abc"], "the seed must be a whole number"),
    (["--preset", "nope"], "Unknown preset 'nope'; valid presets are: k3-topo"),
    (["--preset", "k3"], "only counted, never run"),
    (["--prompt", ""], "The prompt is empty"),
    (["--preset", "tiny", "--prompt", "x" * 600], "allows 512 tokens in all, so use at most 510 bytes"),
    (["--device", "tpu"], "Unknown device 'tpu'; use 'cpu' or 'cuda'"),
    (["--weights", "best"], "invalid choice: 'best'"),
    (["--preset", "tiny", "--weights", "trained"], "No trained weights ship for preset 'tiny' (presets with them: "
                                                   "small"),
    (["--preset", "tiny", "--weights", "trained"], "); use --weights auto or --weights random."),
    (["--open", "/nonexistent/run.npz"], "Cannot open the run: there is no run file"),
    (["--frobnicate"], "Unrecognized arguments: --frobnicate"),
])
def test_bad_command_line_values_are_one_sentence(argv, says, capsys):
    assert tui.main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.startswith("tiny-k3: ") and err.count("\n") == 1, err


def test_a_corrupt_run_file_is_refused_before_the_app_starts(tmp_path, capsys):
    bad = tmp_path / "run.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    assert tui.main(["--open", str(bad)]) == 2
    assert "is not a readable tiny-k3 run file" in capsys.readouterr().err


def test_good_values_parse():
    args = tui.parse_args(["--preset", "tiny", "--seed", "3", "--weights", "random"])
    assert (args.preset, args.seed, args.weights, args.open_path) == ("tiny", 3, "random", None) and args.prompt


def test_outside_the_environment_it_says_to_run_dev_py():
    # -S: no site-packages, so no rich/textual/torch, as with a system python3
    out = subprocess.run([sys.executable, "-S", str(ROOT / "tui.py")], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "run `python3 dev.py run` instead" in out.stderr and out.stderr.count("\n") == 1


def test_the_wheel_ships_the_stylesheet(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("tiny_k3-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "tui_app/tui.tcss" in names and "tui.py" in names and "tui_app/app.py" in names
    assert "tiny_k3/weights/small.safetensors" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "tiny-k3 = tui:main" in zipfile.ZipFile(wheel).read(entry).decode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _first_screen(port: int, want: str, timeout: float) -> str:
    import aiohttp   # noqa: PLC0415 - comes with the optional serve extra

    seen = ""
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + timeout
        while True:                                          # the server may still be starting
            try:
                async with session.get(f"http://127.0.0.1:{port}/") as page:
                    assert page.status == 200 and "tiny-k3" in await page.text()
                break
            except aiohttp.ClientConnectionError:
                assert time.monotonic() < deadline, "the server did not start"
                await asyncio.sleep(0.2)
        async with session.ws_connect(f"http://127.0.0.1:{port}/ws?width=120&height=36") as ws:
            while want not in seen:
                left = deadline - time.monotonic()
                assert left > 0, f"no {want!r} on the first screen; got {seen[-500:]!r}"
                msg = await ws.receive(timeout=left)
                if msg.type == aiohttp.WSMsgType.BINARY:
                    seen += re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", msg.data.decode("utf-8", "replace"))
                elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    raise AssertionError(f"the websocket closed; got {seen[-500:]!r}")
    return seen


def test_serve_shows_the_first_screen_in_a_browser_then_stops():
    pytest.importorskip("textual_serve")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "tui_app.serve", "--host", "127.0.0.1", "--port", str(port),
                               "--", "--preset", "tiny", "--weights", "random"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = asyncio.run(_first_screen(port, "Tokens", timeout=600))   # generous: a loaded machine
        assert "Tokens" in seen
    finally:
        server.send_signal(signal.SIGINT)
        try:
            out, _ = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
    assert server.returncode == 0, out
    assert f"open http://127.0.0.1:{port}" in out


def test_serve_command_runs_this_tui():
    cmd = serve.command(["--preset", "tiny"])
    assert cmd.endswith("tui.py --preset tiny") and sys.executable in cmd
