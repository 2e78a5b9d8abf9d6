"""The package's structure, read from its source (ast): layers, no cycles, no private
names across modules, no function over 100 lines.

The layers, lowest first (also in docs/architecture.md): a module may import its own
layer and those below, never one above. Every import counts, including those inside
functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fleetsieve_bayes"
ROOT = "fleetsieve_bayes"

# (layer name, module prefixes): a module belongs to the layer of its longest matching prefix.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("errors", "arrays", "resources", "settings", "seeds", "validation", "atomic", "exports",
              "jax_cache", "table", "arviz_import", "interrupts", "numerics", "configs")),
    ("allocation", ("allocation",)),
    ("model", ("model",)),
    ("decision", ("decision",)),
    ("campaign files", ("campaign.config", "campaign.journal", "campaign.fingerprint", "campaign.makespan",
                        "deploy.production")),
    ("backends", ("backends", "testing.fake_server", "testing.fake_metrics", "workloads")),
    ("round", ("round", "campaign.windows")),
    ("drivers", ("campaign", "evaluation")),
    ("deploy", ("deploy",)),
    ("api", ("api",)),
    ("reporting", ("reporting",)),
    ("commands", ("commands", "cli", "__main__", "testing")),
    ("package", ("",)),
]
MAX_FUNCTION_LINES = 100


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = list(p.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def layer_of(module: str) -> int:
    best, best_len = len(LAYERS) - 1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for pre in prefixes:
            if (module == pre or module.startswith(pre + ".") or pre == "") and len(pre) > best_len:
                best, best_len = i, len(pre)
    return best


def _resolve(module: str, target: str, names: list[str]) -> list[str]:
    """Package modules an import statement in ``module`` reaches (``target`` relative to ROOT)."""
    hits = []
    for n in names:
        full = f"{target}.{n}" if target else n
        if full in MODULES:
            hits.append(full)
    if not hits and target in MODULES:
        hits.append(target)
    return hits


def _imports(module: str, tree: ast.AST) -> list[tuple[str, int, list[str]]]:
    """(imported package module, line, names taken) for every import in ``tree``."""
    out = []
    is_pkg = MODULES[module].name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == ROOT or a.name.startswith(ROOT + "."):
                    target = a.name[len(ROOT) + 1 :]
                    if target in MODULES:
                        out.append((target, node.lineno, []))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, *(node.module.split(".") if node.module else [])]).strip(".")
            elif node.module and (node.module == ROOT or node.module.startswith(ROOT + ".")):
                target = node.module[len(ROOT) + 1 :]
            else:
                continue
            names = [a.name for a in node.names]
            for hit in _resolve(module, target, names):
                out.append((hit, node.lineno, names if hit == target else []))
    return out


GRAPH = {m: _imports(m, ast.parse(p.read_text(encoding="utf-8"))) for m, p in MODULES.items()}


def test_every_module_has_a_layer() -> None:
    assert layer_of("round") == 6 and layer_of("campaign.runner") == 7 and layer_of("") == len(LAYERS) - 1
    assert all(0 <= layer_of(m) < len(LAYERS) for m in MODULES)


def test_no_import_of_a_higher_layer() -> None:
    bad = [
        f"{m} (layer {LAYERS[layer_of(m)][0]}) imports {t} (layer {LAYERS[layer_of(t)][0]}) at line {line}"
        for m, edges in GRAPH.items()
        for t, line, _ in edges
        if layer_of(t) > layer_of(m)
    ]
    assert not bad, "\n".join(bad)


def test_no_import_cycle() -> None:
    edges = {m: sorted({t for t, _, _ in GRAPH[m] if t != m}) for m in GRAPH}
    # A package's __init__ importing its own submodules is how it exports them: not a cycle edge
    # from a submodule's point of view only when the submodule does not import the package back.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_no_private_name_imported_across_modules() -> None:
    bad = []
    for m, p in MODULES.items():
        tree = ast.parse(p.read_text(encoding="utf-8"))
        modules_as: dict[str, str] = {}
        for t, line, names in GRAPH[m]:
            bad += [f"{m}:{line} imports {n} from {t}" for n in names if n.startswith("_") and not n.startswith("__")]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(ROOT):
                for a in node.names:
                    if f"{node.module[len(ROOT) + 1:]}.{a.name}".strip(".") in MODULES:
                        modules_as[a.asname or a.name] = a.name
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith(ROOT + ".") and a.asname:
                        modules_as[a.asname] = a.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules_as
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                bad.append(f"{m}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "module",
    [
        m for m in sorted(MODULES)
    ],
)
def test_no_function_over_100_lines(module: str) -> None:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{module}: " + ", ".join(long)
