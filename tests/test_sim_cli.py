"""`python -m sim`: the per-token table, the closing memory comparison, `costs`, and bad input."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from sim.__main__ import main
from sim.memory import cache_bytes, format_bytes
from tiny_k3 import K3Config

ROOT = Path(__file__).resolve().parents[1]


def run_main(*argv) -> tuple[int, str]:
    console = Console(record=True, width=160, color_system=None)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = main(list(argv), console=console)
    finally:
        torch.set_num_threads(before)
    return code, console.export_text()


def test_prints_a_row_per_token_and_the_memory_comparison():
    code, out = run_main("--preset", "tiny", "--prompt", "ab", "--steps", "3", "--weights", "random", "--layer", "2")
    assert code == 0, out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert len(rows) == 3 + 3                                   # BOS + 2 prompt bytes, then 3 generated
    assert rows[1].split("│")[2].strip() == "a" and rows[1].split("│")[3].strip() == "b"
    assert "experts L2" in out and "‖S‖ L0" in out
    assert len(rows[0].split("│")[4].split()) == 2              # tiny: top-2 experts per token
    kv, state = cache_bytes(K3Config.preset("tiny"), 6)
    assert "decode cache after 6 tokens" in out and "measured equals sim.memory.cache_bytes" in out
    assert format_bytes(kv + state) in out and "K3 at 1M tokens" in out


def test_costs_prints_the_k3_serving_figures():
    code, out = run_main("costs")
    assert code == 0 and "Kimi K3 serving figures" in out and "Corrections" in out


@pytest.mark.parametrize("argv, message", [
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--preset", "k3"], "only counted, never run"),
    (["--preset", "tiny", "--prompt", ""], "the prompt is empty"),
    (["--preset", "tiny", "--layer", "0"], "--layer 0 has no MoE"),
    (["--preset", "tiny", "--kda-layer", "3"], "--kda-layer 3 is not a KDA layer"),
    (["--preset", "tiny", "--steps", "-1"], "--steps must be 0 or more"),
])
def test_bad_input_is_one_sentence_and_exit_code_2(argv, message):
    code, out = run_main(*argv)
    assert code == 2 and out.startswith("error: ") and message in out
    assert "Traceback" not in out


def test_runs_as_a_module():
    proc = subprocess.run([sys.executable, "-m", "sim", "--preset", "tiny", "--prompt", "a", "--steps", "1",
                           "--weights", "random"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "one row per token" in proc.stdout and "decode cache after 3 tokens" in proc.stdout
