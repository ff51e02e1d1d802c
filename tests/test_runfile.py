"""sim.runfile: save / load round-trips a whole run (branches included), reads without a model, and turns
a file from another version, other weights or plain damage into one sentence."""

import json

import numpy as np
import pytest

import sim
from sim import Simulation, runfile


@pytest.fixture(scope="module")
def branched():
    """A run with a branch and a forced token: the replay must reproduce choices, not just re-run greedily."""
    s = Simulation("tiny", "k=7;", seed=3, weights="random")
    s.run(5)
    s.back()
    s.back()
    s.step(force_token="x")
    s.run(2)
    s.step(temperature=0.8, seed=11)
    s.goto(6)
    return s


def _rewrite(src, dst, change_meta=None, change_arrays=None):
    with np.load(src, allow_pickle=False) as a:
        members = {k: a[k] for k in a.files}
    meta = json.loads(members.pop("meta.json").tobytes())
    if change_meta:
        change_meta(meta)
    if change_arrays:
        change_arrays(members)
    np.savez(dst, **{"meta.json": np.frombuffer(json.dumps(meta).encode(), np.uint8), **members})
    return dst


def test_save_load_round_trip_at_the_same_cursor(branched, tmp_path):
    path = branched.save(tmp_path / "run.npz")
    assert not list(tmp_path.glob("*.part"))               # written beside, then renamed
    back = sim.load(path)
    assert back.cursor == 6 and len(back.frames) == len(branched.frames)
    assert all(a.same_as(b) for a, b in zip(back.frames, branched.frames))
    assert [f.forced for f in back.frames] == [f.forced for f in branched.frames]
    assert (back.temperature, back.sample_seed) == (branched.temperature, branched.sample_seed)
    assert back.prompt == branched.prompt and back.seed == 3 and back.weights == "random"
    # and it is a live Simulation: stepping on equals stepping the original on
    back.goto(len(back.frames) - 1)
    branched_copy = sim.load(path)
    branched_copy.goto(len(branched_copy.frames) - 1)
    assert back.step().same_as(branched_copy.step())


def test_cursor_argument_and_read_without_a_model(branched, tmp_path):
    path = runfile.save(branched, tmp_path / "run.npz", cursor=2)
    run = runfile.read(path)
    assert run.meta["cursor"] == 2 and run.meta["preset"] == "tiny" and run.meta["weights_id"] == "random init, seed 3"
    assert all(a.same_as(b) for a, b in zip(run.frames, branched.frames))
    cfg = branched.config
    ids = run.arrays["routing.expert_ids"]
    assert ids.shape == (len(branched.frames), len(cfg.moe_layers), cfg.top_k)
    np.testing.assert_array_equal(ids[4, 0], branched.frames[4].routing[0].expert_ids)
    assert run.arrays["kda.state"].dtype == np.float16
    with pytest.raises(ValueError, match="cursor must be a frame number from 0 to"):
        runfile.save(branched, tmp_path / "x.npz", cursor=99)


def test_other_version_other_weights_and_damage_are_one_sentence(branched, tmp_path):
    good = branched.save(tmp_path / "run.npz")
    cases = {
        "version": (_rewrite(good, tmp_path / "v.npz", lambda m: m.update(version=99)), "version 99 run file"),
        "format": (_rewrite(good, tmp_path / "f.npz", lambda m: m.update(format="x")), "not a tiny-k3 run file"),
        "weights": (_rewrite(good, tmp_path / "w.npz", lambda m: m.update(weights_id="trained tiny sha256:0")),
                    "was recorded with weights"),
        "frames": (_rewrite(good, tmp_path / "d.npz",
                            change_arrays=lambda a: a.__setitem__("kda.beta", a["kda.beta"] + 1)),
                   "does not replay to the frames it holds"),
        "header": (_rewrite(good, tmp_path / "h.npz", change_arrays=lambda a: a.pop("kda.beta")), "is damaged"),
    }
    garbage = tmp_path / "g.npz"
    garbage.write_bytes(b"not a zip file at all")
    cases["garbage"] = (garbage, "not a readable tiny-k3 run file")
    cases["missing"] = (tmp_path / "none.npz", "there is no run file")
    for what, (path, says) in cases.items():
        with pytest.raises(ValueError) as err:
            sim.load(path)
        msg = str(err.value)
        assert says in msg and "\n" not in msg, what


def test_progress_reports_every_frame_and_can_abandon(branched, tmp_path):
    path = branched.save(tmp_path / "run.npz")
    seen = []
    sim.load(path, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (len(branched.frames), len(branched.frames)) and seen[0][0] == 1

    class Stop(Exception):
        pass

    def stop_at_two(done, total):
        if done == 2:
            raise Stop

    with pytest.raises(Stop):
        Simulation("tiny", "hello", progress=stop_at_two)


def test_the_format_module_imports_no_simulation_and_sim_load_is_from_run():
    """sim/runfile.py is the format only: session imports it, never the other way (no import circle)."""
    import ast
    import pathlib

    import sim

    tree = ast.parse(pathlib.Path(runfile.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
               {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m and m.endswith("session") for m in imported), imported
    from sim.streamed_run import open_run
    assert sim.load is open_run      # which is Simulation.from_run for a preset's run (the tests above)
