"""Every citation in the lessons, modules, README and bench resolves to a file and section inside the repository.

Three kinds of citation are checked (docs/ holds the project's reference notes):

    kda.md, k3_facts.md, lessons/README.md     a file: a path from the repository root or the citing file's folder,
                                               or a bare name found in docs/ (or anywhere in the tree); tracked by
                                               git when the tree is a git checkout (an ignored file does not count)
    k3_facts.md §1b,  … (§3b)                  a section: a heading "## 1b." / "### 1b " of the named file; a bare §
                                               refers to the last .md file the citing file named before it; a §
                                               right after a paper id (arXiv:…, "DeepSeek-V2 §2.1") is the paper's
    S12                                        a source id listed under "## Sources" in docs/k3_facts.md, whose line
                                               gives a URL or a paper id
"""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SCANNED = ["lessons/*.py", "lessons/*.md", "lessons/checks/*.py", "lessons/solutions/*.py", "tiny_k3/**/*.py",
           "sim/**/*.py", "tui*.py", "README.md", "bench/*.py", "dev.py"]

FILE_RE = re.compile(r"(?<![\w/.-])((?:\.\./|[\w-]+/)*[\w-]+\.md)\b")
SECTION_RE = re.compile(r"§\s?(\d+[a-z]?(?:\.\d+)*)")
SOURCE_RE = re.compile(r"(?<![\w.])S([1-9]\d?)(?![\w\[(=])(?!\s*=[^=])")
# a § that belongs to a paper, not to one of our notes: the paper is named just before it
PAPER_BEFORE = re.compile(r"(arXiv:\s?\d{4}\.\d{4,5}(v\d)?|DeepSeek-V[23]|the paper's?|LatentMoE|Kimi Linear report)"
                          r"[^§\n]{0,40}$")


def _scanned_files() -> list[Path]:
    files = sorted({p for pattern in SCANNED for p in ROOT.glob(pattern) if p.is_file()})
    return [p for p in files if ".venv" not in p.parts and "__pycache__" not in p.parts]


@lru_cache(maxsize=None)
def _tracked() -> frozenset[str] | None:
    """Paths git tracks or would track (not ignored); None outside a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return frozenset(out.split())


def _resolve(name: str, citing: Path) -> Path | None:
    candidates = [citing.parent / name, ROOT / name]
    if "/" not in name:
        candidates += [DOCS / name, *sorted(ROOT.glob(f"**/{name}"))]
    tracked = _tracked()
    for path in candidates:
        path = path.resolve()
        if not path.is_file() or ROOT not in path.parents or ".venv" in path.parts:
            continue
        if tracked is not None and str(path.relative_to(ROOT)) not in tracked:
            continue
        return path
    return None


@lru_cache(maxsize=None)
def _sections(path: Path) -> frozenset[str]:
    """Section numbers of a markdown file: the first word of each heading, without its trailing dot."""
    found = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#+\s+(\d+[a-z]?(?:\.\d+)*)\.?(\s|$)", line)
        if m:
            found.add(m.group(1))
    return frozenset(found)


@lru_cache(maxsize=None)
def _sources() -> dict[str, str]:
    text = (DOCS / "k3_facts.md").read_text(encoding="utf-8")
    listed = text.split("## Sources", 1)[1]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\* S(\d+) (.*)$", listed, re.M)}


def citation_problems(path: Path) -> list[str]:
    """Unresolved citations of one file, as 'file:line: what'."""
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT)
    events = [(m.start(), "file", m) for m in FILE_RE.finditer(text)]
    events += [(m.start(), "section", m) for m in SECTION_RE.finditer(text)]
    events += [(m.start(), "source", m) for m in SOURCE_RE.finditer(text)]
    problems, current = [], None
    for start, kind, m in sorted(events, key=lambda e: e[0]):
        line = text.count("\n", 0, start) + 1
        where = f"{rel}:{line}"
        if kind == "file":
            target = _resolve(m.group(1), path)
            if target is None:
                problems.append(f"{where}: {m.group(1)} is not a tracked file of the repository")
            elif target.suffix == ".md":
                current = target
        elif kind == "section":
            before = text[max(0, start - 80):start]
            if PAPER_BEFORE.search(before):
                continue
            if current is None:
                problems.append(f"{where}: §{m.group(1)} names no file (cite it as `file.md §{m.group(1)}`)")
            elif m.group(1) not in _sections(current):
                problems.append(f"{where}: §{m.group(1)} is not a section of {current.relative_to(ROOT)}")
        else:
            sources = _sources()
            if m.group(1) not in sources:
                problems.append(f"{where}: S{m.group(1)} is not listed under Sources in docs/k3_facts.md")
    return problems


def test_the_reference_notes_exist():
    for name in ("kda.md", "attnres.md", "mla.md", "moe.md", "k3_facts.md"):
        assert (DOCS / name).is_file(), f"docs/{name} is missing"
        assert _sections(DOCS / name), f"docs/{name} has no numbered sections"


def test_every_source_gives_a_url_or_a_paper_id():
    sources = _sources()
    assert sources and sorted(map(int, sources)) == list(range(1, len(sources) + 1)), "S1..Sn, none missing"
    for n, line in sources.items():
        assert re.search(r"https?://|arXiv:\d{4}\.\d{4,5}", line), f"S{n} gives neither a URL nor a paper id: {line}"


def test_every_citation_resolves():
    files = _scanned_files()
    assert len(files) > 20, "the scan found the lessons and modules"
    problems = [p for f in files for p in citation_problems(f)]
    assert not problems, "unresolved citations:\n" + "\n".join(problems)


@pytest.mark.parametrize("snippet, ok", [
    ("see k3_facts.md §1b", True),
    ("see k3_facts.md §9z", False),
    ("see kda.md §2, then §3", True),
    ("see kda.md §2, then §42", False),
    ("arXiv:2412.19437 §2.1.2", True),
    ("a bare §3 with no file", False),
    ("notes/NOWHERE.md", False),
    ("sources S5 and S12", True),
    ("source S99", False),
    ("S = block size; S0 = state", True),
])
def test_the_checker_itself_catches_what_it_should(tmp_path, monkeypatch, snippet, ok):
    probe = ROOT / "tests" / "_citation_probe.py"
    probe.write_text(f'"""{snippet}"""\n', encoding="utf-8")
    try:
        monkeypatch.setattr(_tracked_module(), "_tracked", lambda: None)
        assert (not citation_problems(probe)) is ok, citation_problems(probe)
    finally:
        probe.unlink()


def _tracked_module():
    import sys

    return sys.modules[__name__]


def test_no_source_is_quoted_as_saying_vs_k2():
    """The 6.3x is Moonshot's claim for Delta Attention (Kimi Linear's TPOT); nobody wrote "vs K2": never quote it."""
    quoted = re.compile(r"[\"“'‘][^\"”'’\n]{0,60}\bvs\.? K2\b[^\"”'’\n]{0,60}[\"”'’]")
    files = _scanned_files() + sorted(DOCS.glob("*.md"))
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files for m in quoted.finditer(p.read_text(encoding="utf-8"))]
    assert not found, "a quoted 'vs K2':\n" + "\n".join(found)
