"""`sim real` end to end on a synthetic checkpoint in the exact released layout (no real weights, no network).

sim.real_synthetic writes the release (the same one `python -m sim real DIR --synthetic` and lesson 6 write): a tiny
K3-shaped TinyK3 with every weight perturbed off its init (depth queries, norms, selection bias too) has its routed
experts rounded to MXFP4 and is written by tiny_k3.released.write_checkpoint: the released names, dtypes, packed
experts and E8M0 scales, one shard per layer, an index json and a config.json with the released fields.
RealSimulation streams it; a Simulation over the same TinyK3 is the reference.
"""

import json

import numpy as np
import pytest

from sim import session as session_module
from sim.__main__ import main
from sim.real import RealSimulation, layer_bytes, main_real
from sim.real_synthetic import write_synthetic_release
from sim.session import Simulation
from tiny_k3.released import EXPERT, ReleasedFormatError, released_tensors, spec_bytes

PROMPT = "a=3;"
STEPS = 3


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return write_synthetic_release(tmp_path_factory.mktemp("release"))


def reference(model, monkeypatch) -> Simulation:
    monkeypatch.setattr(session_module, "_build_models", lambda *a: (model, "random", None, "none"))
    sim = Simulation(model.config, PROMPT, twin=False)
    sim.run(STEPS)
    return sim


def test_the_synthetic_folder_is_the_released_layout(release):
    config, _, folder = release
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    specs = released_tensors(config)
    assert set(index["weight_map"]) == set(specs)
    assert index["metadata"]["total_size"] == sum(spec_bytes(s) for s in specs.values())
    whole = json.loads((folder / "config.json").read_text())
    assert whole["text_config"]["quantization_config"]["format"] == "mxfp4-pack-quantized"
    from safetensors import safe_open
    shard = index["weight_map"][EXPERT.format(layer=1, expert=5) + "w2.weight_packed"]
    with safe_open(str(folder / shard), framework="pt") as f:
        assert f.get_slice(EXPERT.format(layer=1, expert=5) + "w2.weight_packed").get_dtype() == "U8"
        assert tuple(f.get_slice(EXPERT.format(layer=1, expert=5) + "w2.weight_scale").get_shape()) == (32, 1)


def test_the_stream_records_the_frames_tinyk3_records(release, monkeypatch):
    config, model, folder = release
    ref = reference(model, monkeypatch)
    real = RealSimulation(folder, PROMPT)
    real.run(STEPS)
    assert len(real.frames) == len(ref.frames) == len(PROMPT) + 1 + STEPS
    for a, b in zip(real.frames, ref.frames):
        assert (a.input_id, a.token_id, a.position) == (b.input_id, b.token_id, b.position)
        assert len(a.routing) == len(b.routing) == len(config.moe_layers)
        for ra, rb in zip(a.routing, b.routing):
            assert ra.layer == rb.layer and np.array_equal(ra.expert_ids, rb.expert_ids)     # exact routing
            assert np.array_equal(ra.bias, rb.bias)
            np.testing.assert_allclose(ra.scores, rb.scores, rtol=0, atol=1e-5)
            np.testing.assert_allclose(ra.weights, rb.weights, rtol=0, atol=1e-5)
        for ka, kb in zip(a.kda, b.kda):
            for field in ("decay", "beta", "state_norm", "correction_norm"):
                np.testing.assert_allclose(getattr(ka, field), getattr(kb, field), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(ka.state.astype(np.float32), kb.state.astype(np.float32), atol=2e-3)  # fp16 copy
        for da, db in zip(a.depth, b.depth):
            assert (da.layer, da.site) == (db.layer, db.site)
            np.testing.assert_allclose(da.weights, db.weights, rtol=0, atol=1e-5)
            assert da.h_norm == pytest.approx(db.h_norm, rel=1e-5, abs=1e-6)
        for sa, sb in zip(a.sublayers, b.sublayers):
            assert (sa.layer, sa.kind) == (sb.layer, sb.kind)
            assert sa.out_norm == pytest.approx(sb.out_norm, rel=1e-5, abs=1e-6)
        assert a.memory == b.memory
    for la, lb in zip(real._logits, ref._logits):
        np.testing.assert_allclose(la, lb, rtol=0, atol=1e-5)
    assert any(not np.allclose(r.weights, r.weights[0]) for f in real.frames for r in f.depth if len(r.weights) > 1)


def test_each_token_reads_only_its_chosen_experts(release):
    config, _, folder = release
    real = RealSimulation(folder, PROMPT)
    real.run(STEPS)
    ck = real.checkpoint
    sizes = layer_bytes(config)
    for f in real.frames:
        chosen = {(r.layer, int(e)) for r in f.routing for e in r.expert_ids}
        read = [n for t, n, _ in ck.reads if t == f.position and ".experts." in n]
        want = sorted(EXPERT.format(layer=layer, expert=e) + f"{w}.weight_{part}"
                      for layer, e in chosen for w in ("w1", "w2", "w3") for part in ("packed", "scale"))
        assert sorted(read) == want                                   # each chosen expert once, nothing else
        expert_bytes = sum(b for t, n, b in ck.reads if t == f.position and ".experts." in n)
        assert expert_bytes == len(chosen) * sizes["expert"]
        assert ck.bytes_read(f.position) == sizes["non_expert_per_token"] + expert_bytes


def test_missing_files_and_bad_folders_are_named_before_the_first_token(release, tmp_path):
    _, _, folder = release
    with pytest.raises(ReleasedFormatError, match="is not a folder"):
        RealSimulation(tmp_path / "nowhere", PROMPT)
    broken = tmp_path / "broken"
    broken.mkdir()
    for p in folder.iterdir():
        if not p.name.startswith("model-00002"):
            (broken / p.name).symlink_to(p)
    with pytest.raises(ReleasedFormatError, match=r"1 of the 5 shards .* are missing .* model-00002-of-00005"):
        RealSimulation(broken, PROMPT)
    (tmp_path / "noindex").mkdir()
    (tmp_path / "noindex" / "config.json").symlink_to(folder / "config.json")
    with pytest.raises(ReleasedFormatError, match="model.safetensors.index.json is missing"):
        RealSimulation(tmp_path / "noindex", PROMPT)


def test_a_machine_without_the_ram_is_told_before_the_first_token(release, monkeypatch):
    _, _, folder = release
    import sim.real_needs as real_needs
    monkeypatch.setattr(real_needs, "available_ram", lambda: 1000)
    with pytest.raises(MemoryError, match=r"needs about .* GiB of free RAM .* is available"):
        RealSimulation(folder, PROMPT)


def test_the_command_prints_bytes_per_token_and_saves_the_frames(release, tmp_path):
    from rich.console import Console

    from sim import runfile
    _, _, folder = release
    console = Console(record=True, width=200)
    run = tmp_path / "run.npz"
    assert main([ "real", str(folder), "--prompt", "hi", "--tokens", "1", "--save", str(run)], console) == 0
    out = console.export_text()
    assert "bytes read" in out and "KB" in out and "streamed from disk" in out and "saved 4 frames" in out
    saved = runfile.read(run)
    again = RealSimulation(folder, "hi")
    again.run(1)
    assert saved.meta["weights"] == saved.meta["weights_id"] == f"released {folder.name}"
    assert all(a.same_as(b) for a, b in zip(saved.frames, again.frames)) and len(saved.frames) == 4
    assert saved.meta["tokenizer"]["name"].startswith("bytes")       # the run says which tokenizer it used
    assert "tokenizer: bytes" in out and "truncated" not in out
    with pytest.raises(ValueError, match="streamed from a released checkpoint"):
        Simulation.from_run(run)
    assert main_real([str(folder / "missing")], console) == 2
    assert "is not a folder" in console.export_text()


def test_progress_comes_once_per_layer_per_token(release):
    config, _, folder = release
    calls = []
    real = RealSimulation(folder, "hi", progress=lambda done, total, seconds: calls.append((done, total)))
    assert calls == [(i + 1, config.num_layers) for i in range(config.num_layers)] * 3     # BOS, h, i
    real.run(1)
    assert len(calls) == 4 * config.num_layers


def test_the_table_of_a_synthetic_index_accounts_for_every_byte(release):
    from tiny_k3.released import expand_table, summarize_index
    config, _, folder = release
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    whole = json.loads((folder / "config.json").read_text())
    table = summarize_index(index, whole)
    assert table["bytes_from_shapes"] == table["total_size"] == index["metadata"]["total_size"]
    assert sorted(expand_table(table)) == sorted(index["weight_map"])
    assert {n.split(".")[0] for n in table["missing_from_index"]} == {"vision_tower", "mm_projector"}
    bad = dict(index, weight_map={**index["weight_map"], "language_model.model.layers.0.extra.weight": "x"})
    with pytest.raises(ReleasedFormatError, match="outside the released layout"):
        summarize_index(bad, whole)


def test_a_what_if_on_the_stream_is_the_what_if_on_tinyk3(release, monkeypatch):
    from sim.interventions import AblateExpert, ResetState, UniformDepth
    config, model, folder = release
    real = RealSimulation(folder, PROMPT)
    real.run(STEPS)
    ref = reference(model, monkeypatch)
    real.goto(len(PROMPT) + 1)
    ref.goto(len(PROMPT) + 1)
    chosen = int(real.frame.routing[0].expert_ids[0])
    for changes in ((), (UniformDepth(),), (ResetState(),), (AblateExpert(config.moe_layers[0], chosen),)):
        a, b = real.what_if(*changes, steps=2), ref.what_if(*changes, steps=2)
        np.testing.assert_allclose(a.kl, b.kl, rtol=1e-3, atol=1e-7)
        for fa, fb in zip(a.frames, b.frames, strict=True):
            assert fa.token_id == fb.token_id
            assert all(np.array_equal(ra.expert_ids, rb.expert_ids) for ra, rb in zip(fa.routing, fb.routing))
    assert chosen not in real.what_if(AblateExpert(config.moe_layers[0], chosen)).frames[0].routing[0].expert_ids
    assert real.what_if().kl[0] == 0                                  # no change is the original exactly


# ---------------------------------------------------------------------------- `python -m sim real DIR --synthetic`
def run_real(*argv) -> tuple[int, str]:
    from rich.console import Console
    console = Console(record=True, width=400)        # wide: a one-line error stays one line
    code = main(["real", *map(str, argv)], console)
    return code, console.export_text()


def text_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("text: "))


def test_synthetic_writes_the_tested_release_into_a_missing_folder_then_streams_it(release, tmp_path):
    _, _, tested = release
    folder = tmp_path / "new" / "release"
    code, out = run_real(folder, "--synthetic", "--prompt", "hi", "--tokens", "2")
    assert code == 0, out
    assert f"wrote a synthetic release in {folder}" in out and "random weights, not K3's" in out
    assert "streamed from disk" in out and "bytes read" in out
    # the very release the tests above check: the same files, to the byte (marker included)
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in tested.iterdir())
    for p in tested.iterdir():
        assert (folder / p.name).read_bytes() == p.read_bytes(), p.name
    # and streamed as `python -m sim real DIR` streams it
    code, plain = run_real(folder, "--prompt", "hi", "--tokens", "2")
    assert code == 0 and text_line(plain) == text_line(out)
    assert "synthetic release" not in plain


def test_synthetic_into_an_empty_folder_and_again_into_its_own_release(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    code, out = run_real(folder, "--synthetic", "--tokens", "0")
    assert code == 0 and "wrote a synthetic release" in out, out
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    code, again = run_real(folder, "--synthetic", "--tokens", "0")
    assert code == 0 and f"found a synthetic release in {folder}" in again, again
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps      # streamed as it was, not rewritten


def test_synthetic_refuses_a_folder_that_holds_anything_else_in_one_line(release, tmp_path):
    _, _, tested = release
    other = tmp_path / "notes"
    other.mkdir()
    (other / "notes.txt").write_text("keep me\n")
    real_like = tmp_path / "checkpoint"            # a released folder without the marker: never written into
    real_like.mkdir()
    for p in tested.iterdir():
        if p.name != "synthetic.json":
            (real_like / p.name).symlink_to(p)
    a_file = tmp_path / "file.bin"
    a_file.write_bytes(b"x")
    cases = [((other, "--synthetic"), "is not empty and holds no synthetic release"),
             ((real_like, "--synthetic"), "is not empty and holds no synthetic release"),
             ((a_file, "--synthetic"), "is a file; --synthetic needs an empty or new folder"),
             ((tmp_path / "new", "--synthetic", "--download", "0-3"), "cannot be combined with --download")]
    for argv, message in cases:
        code, out = run_real(*argv)
        assert code == 2 and out.startswith("error: ") and message in out, out
        assert len(out.strip().splitlines()) == 1 and "Traceback" not in out
    assert [p.name for p in other.iterdir()] == ["notes.txt"] and not (tmp_path / "new").exists()
    assert not (real_like / "synthetic.json").exists()
