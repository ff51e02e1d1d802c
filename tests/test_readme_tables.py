"""The README quotes measured tables; each quoted line must be in the bench output it names."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quoted_blocks(text: str) -> list[list[str]]:
    """The lines of every fenced block (```lang ... ```), fence lines excluded."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_the_readme_recall_table_is_a_verbatim_part_of_bench_recall_output():
    readme = (ROOT / "README.md").read_text()
    bench = (ROOT / "bench/results/bench_recall.txt").read_text().splitlines()
    tables = [b for b in quoted_blocks(readme) if b and b[0].startswith("pairs ")]
    assert tables, "README.md should quote bench_recall's recall-vs-pairs table in a ``` block"
    for table in tables:
        start = bench.index(table[0]) if table[0] in bench else -1
        assert start >= 0, f"README's table header {table[0]!r} is not in bench/results/bench_recall.txt"
        assert bench[start:start + len(table)] == table, (
            "README's recall table differs from bench/results/bench_recall.txt: re-run bench/bench_recall.py "
            "and paste its table into README.md")


def test_the_readme_targets_block_is_a_verbatim_part_of_bench_recall_output():
    """The README's verdict on the attention issue's targets is bench_recall's computed lines, not narrated."""
    readme = (ROOT / "README.md").read_text()
    bench = (ROOT / "bench/results/bench_recall.txt").read_text().splitlines()
    blocks = [b for b in quoted_blocks(readme) if b and b[0].startswith(("met ", "NOT met"))]
    assert blocks, "README.md should quote bench_recall's targets section in a ``` block"
    for block in blocks:
        start = bench.index(block[0]) if block[0] in bench else -1
        assert start >= 0 and bench[start:start + len(block)] == block, (
            "README's targets differ from bench/results/bench_recall.txt: re-run bench/bench_recall.py and paste "
            "its section 5 into README.md")
        assert bench[start - 1].startswith("5. the targets"), "the whole section, from its first line"


def test_the_readme_reading_of_where_the_hybrids_recall_lives_is_bench_recalls():
    """"hiding the definitions from them sends it to near chance at 52 pairs", "At 2 pairs the same cut costs it
    nothing", "Every target line reads met" and "the twin ... holds 100 % at 52 pairs" are read off bench_recall's
    target lines: blind at 52 pairs at most 20 % (chance is 10 %), a cost of 0 at 2 pairs, no line NOT met, and the
    twin's cell at 52 pairs."""
    import re

    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    bench = (ROOT / "bench/results/bench_recall.txt").read_text()
    at52 = re.search(r"hiding the definitions from small's MLA costs >= 20 points at 52 pairs: (\d+)% \S+ -> "
                     r"(\d+)% \S+ \((-?\d+)\)", bench)
    at2 = re.search(r"\.\.\. and <= 5 at 2 pairs: (\d+)% \S+ -> (\d+)% \S+ \((-?\d+)\)", bench)
    twin52 = re.search(r"small-twin >= 80% at 52 pairs: lowest (\d+)% \S+ at 52", bench)
    targets = [line for line in bench[bench.index("5. the targets"):].splitlines()
               if line.startswith(("met ", "NOT met "))]
    assert at52 and at2 and twin52, "bench_recall.txt has both MLA-blind target lines and the twin's at 52 pairs"
    assert "hiding the definitions from them sends it to near chance at 52 pairs" in readme
    assert int(at52.group(2)) <= 20, at52.group(0)
    assert "At 2 pairs the same cut costs it nothing" in readme
    assert int(at2.group(3)) == 0, at2.group(0)
    assert len(targets) >= 10 and "Every target line reads met" in readme
    assert not [line for line in targets if line.startswith("NOT met")], targets
    assert f"holds {twin52.group(1)} % at 52 pairs" in readme, twin52.group(0)


def test_the_readme_real_checkpoint_figures_are_the_code_s():
    """"137 GB a token ... 68.5 s on a 2 GB/s disk; 25.8 GB with --keep" and "--download 0-3 ... 57.6 GB of the
    1.56 TB" are what sim.real and sim.real_download compute from the committed table of the real index (lesson 6
    prints the same download by the same code)."""
    import json

    from sim.real import layer_bytes
    from sim.real_download import parse_layers, shard_sizes, shards_for
    from tiny_k3 import K3Config
    from tiny_k3.released import RELEASED_CONFIG, expand_table, layer_of, load_k3_table

    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    per = layer_bytes(K3Config.preset("k3"))
    token = per["non_expert_per_token"] + per["experts_per_token"]
    assert (f"({token / 1e9:.0f} GB a token for the real K3, {token / 2e9:.1f} s on a 2 GB/s disk; "
            f"{per['experts_per_token'] / 1e9:.1f} GB with `--keep`)") in readme
    index, released = load_k3_table(), json.loads(RELEASED_CONFIG.read_text())
    weight_map = {name: index["shards"][f"layer {layer_of(name)}" if layer_of(name) >= 0 else name.split(".")[0]][0]
                  for name in expand_table(index)}
    sizes = shard_sizes(weight_map, released)
    first_four = shards_for(weight_map, parse_layers("0-3", released["text_config"]["num_hidden_layers"]))
    assert (f"({sum(sizes[s] for s in first_four) / 1e9:.1f} GB of the {sum(sizes.values()) / 1e12:.2f} TB"
            in readme)


def test_the_readme_compiled_path_figures_are_bench_trains_small_row():
    """README's eager and compiled step times of `small` and their ratio are bench/results/bench_train.txt's row."""
    import re

    readme = " ".join((ROOT / "README.md").read_text().split())
    row = next(line.split() for line in (ROOT / "bench/results/bench_train.txt").read_text().splitlines()
               if line.split()[:1] == ["small"])
    eager, compiled, speedup = float(row[1]), float(row[4]), row[7]
    said = re.search(r"a training step of `small` ([\d,]+) ms eager, ([\d,]+) ms compiled \(([\d.]+x)", readme)
    assert said, "README.md should give small's eager and compiled step times from bench_train.txt"
    assert (float(said[1].replace(",", "")), float(said[2].replace(",", "")), said[3]) == \
        (round(eager), round(compiled), speedup), (said.groups(), row)
