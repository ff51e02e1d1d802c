"""bench/provenance.py: a result's first line names the command, the machine and the load that made it."""

import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))

from provenance import cpu_model, provenance_line  # noqa: E402


def test_the_line_names_the_command_the_machine_and_the_load():
    line = provenance_line(["bench/bench_kda.py", "--threads", "1", "--note", "two words"])
    command, machine, load = line.split("; ")[:3]
    assert command == "command: python bench/bench_kda.py --threads 1 --note 'two words'", (
        "the command must be one a user can paste back into a shell, quoting included")
    assert machine.startswith(f"machine: {cpu_model()}, {os.cpu_count()} CPUs, torch "), machine
    if hasattr(os, "getloadavg"):
        averages = load.removeprefix("load: ").split(" (")[0].split()
        assert len(averages) == 3 and all(float(a) >= 0 for a in averages), load
    assert line.endswith("Z"), "the line ends with the UTC time the run started"


def test_every_bench_prints_the_line_first_and_answers_help():
    bench = pathlib.Path(__file__).resolve().parents[1] / "bench"
    for script in sorted(bench.glob("bench_*.py")):
        text = script.read_text()
        assert "provenance_line()" in text, f"{script.name} must print provenance_line() before its results"
        assert "argparse.ArgumentParser" in text, f"{script.name} must take --help (argparse)"
