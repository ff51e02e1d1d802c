"""sim.threads: the TUI computes with the cores other work leaves free, at least one, at most torch's own count;
a thread count the user set in the environment is kept."""

from __future__ import annotations

import os

import pytest
import torch

from sim import threads


@pytest.mark.parametrize("threads_, cpus, load, expected", [
    (2, 2, 0.2, 2),        # idle: torch's own count
    (2, 2, 0.6, 1),        # one core's worth of other work (rounded)
    (2, 2, 5.3, 1),        # the machine: never fewer than one
    (8, 16, 4.0, 8),       # free cores beyond torch's count: torch's count
    (8, 8, 3.4, 5),
])
def test_free_cores_is_torchs_count_capped_by_the_free_cores(threads_, cpus, load, expected):
    assert threads.free_cores(threads_, cpus, load) == expected


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_use_free_cores_sets_torchs_threads_from_the_load(monkeypatch, restore_threads):
    torch.set_num_threads(2)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (5.3, 4.0, 3.0), raising=False)
    assert threads.use_free_cores(environ={}) == 1 and torch.get_num_threads() == 1
    torch.set_num_threads(2)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1), raising=False)
    assert threads.use_free_cores(environ={}) == 2 and torch.get_num_threads() == 2


@pytest.mark.parametrize("name", threads.CHOSEN_BY_USER)
def test_a_thread_count_set_in_the_environment_is_kept(monkeypatch, restore_threads, name):
    torch.set_num_threads(2)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0), raising=False)
    assert threads.use_free_cores(environ={name: "2"}) == 2 and torch.get_num_threads() == 2


def test_the_tui_command_line_uses_the_free_cores_before_the_app_starts(monkeypatch):
    import tui_app.cli as cli

    calls = []
    monkeypatch.setattr(cli, "use_free_cores", lambda: calls.append("threads"))

    class NoApp:                       # the app itself is not started here: only the order of the calls
        return_code = 0

        def __init__(self, *args, **kwargs):
            calls.append("app")

        def run(self):
            calls.append("run")

    monkeypatch.setattr(cli, "TinyK3App", NoApp)
    assert cli.main([]) == 0 and calls == ["threads", "app", "run"]
