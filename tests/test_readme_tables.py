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
