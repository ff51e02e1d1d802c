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
