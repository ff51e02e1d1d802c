"""The house rules of issue 28, measured on the code: every function <= 60 lines, every class <= 400, every module
<= 500, at most 10 private names imported across modules, and no import circle (imports inside functions count:
a lazy import hides a circle, it does not break it). Plus the small shared helpers the split left public."""

import ast
import pathlib

import numpy as np

from sim.frame import Choice
from sim.interventions import layer_span
from sim.sampling import choose_token, sample_token

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("tiny_k3", "sim", "tui_app", "devkit")
LIMITS = {"function": 60, "class": 400, "module": 500}


def _modules() -> dict[str, pathlib.Path]:
    files = [p for d in PACKAGES for p in (ROOT / d).rglob("*.py")] + [ROOT / "tui.py", ROOT / "dev.py"]
    out = {}
    for f in files:
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(name: str, path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every `from X import names` and `import X` in the file, relative ones resolved."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.append((module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
    return found


def test_every_function_class_and_module_is_within_its_limit():
    too_long = []
    for name, path in _modules().items():
        source = path.read_text()
        if len(source.splitlines()) > LIMITS["module"]:
            too_long.append(f"module {name}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            kind = ("function" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    else "class" if isinstance(node, ast.ClassDef) else None)
            if kind and node.end_lineno - node.lineno + 1 > LIMITS[kind]:
                too_long.append(f"{kind} {name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_long, ("over the house limits (function 60, class 400, module 500 lines): split by what each "
                          "part does, " + "; ".join(too_long))


def test_few_private_names_cross_a_module_boundary_and_no_import_circles():
    modules = _modules()
    private, edges = [], {m: set() for m in modules}
    for name, path in modules.items():
        for module, names in _imports(name, path):
            if module.split(".")[0] not in PACKAGES + ("tui", "dev"):
                continue
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    private.append(f"{name} imports {module}.{n}")
                if f"{module}.{n}" in modules:
                    edges[name].add(f"{module}.{n}")
            if module in modules and module != name:
                edges[name].add(module)
    assert len(private) <= 10, f"{len(private)} private names imported across modules (at most 10): {private}"

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    # A package's __init__ only gathers names for import; the edges that can close a circle run between modules.
    packages = {m for m in modules if modules[m].name == "__init__.py"}
    edges = {m: {n for n in to if n not in packages} for m, to in edges.items() if m not in packages}
    circles = sorted(m for m in edges if m in reach(m))
    assert not circles, f"modules that import themselves back through others (a circle): {circles}"


def test_layer_span_lists_a_few_layers_and_shortens_many():
    assert layer_span([1, 3, 5]) == "1, 3, 5"
    assert layer_span(list(range(2, 12))) == "2 to 11", "more than 8 layers read as first to last"


def test_choose_token_takes_the_forced_token_or_the_seeded_draw():
    logits = np.array([0.1, 2.0, -1.0, 0.5], dtype=np.float32)
    assert choose_token(logits, 7, Choice.forced(3)) == 3
    sampled = Choice.sampled(1.0, 11)
    assert choose_token(logits, 7, sampled) == sample_token(logits, 1.0, 11, 7)
    assert choose_token(logits, 7, Choice.sampled(0.0, 11)) == 1, "temperature 0 is the argmax"
