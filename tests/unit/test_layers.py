"""The structure rule (docs/internals/pipeline.md): imports point downstream
only -- core <- parser, reducer, schemas, transport <- shape <- snapshot,
verify <- metrics <- producer, applier <- cli, sandbox -- and no package imports a
package above it, so there is no cycle between packages.  Imports only for
type checking (``if TYPE_CHECKING:``) create no dependency at run time and
are not counted."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2] / "cynomys"

#: Layer of each top-level package or module of cynomys (higher imports lower).
LAYERS = {
    "core": 0, "compiled": 0, "_speedups": 0,
    "parser": 1, "reducer": 1, "schemas": 1, "transport": 1,
    # shape: the [shape] rules as pure logic; verify checksums rows shaped.
    "shape": 2,
    "snapshot": 3, "verify": 3,
    "metrics": 4,
    "producer": 5, "applier": 5,
    "cli": 6, "sandbox": 6,
}


def _type_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            out |= {id(n) for b in node.body for n in ast.walk(b)}
    return out


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    skip = _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cynomys."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("cynomys."))
    return found


def _top(module: str) -> str:
    return module.split(".")[1]


def test_every_package_has_a_layer() -> None:
    tops = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
            if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    tops |= {"_speedups"}
    assert tops <= set(LAYERS), f"give these a layer: {sorted(tops - set(LAYERS))}"


def test_imports_point_downstream_only() -> None:
    upward = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        me = rel.parts[1] if len(rel.parts) > 1 else ""
        if me in ("__init__", ""):
            continue
        for module in _imports(path):
            other = _top(module)
            if other != me and LAYERS[other] > LAYERS[me]:
                upward.append(f"{'.'.join(rel.parts)} -> {module}")
    assert not upward, "imports pointing upstream:\n" + "\n".join(sorted(upward))


def test_no_cycle_between_packages() -> None:
    edges: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        me = rel.parts[1] if len(rel.parts) > 1 else ""
        edges.setdefault(me, set()).update(t for t in map(_top, _imports(path)) if t != me)

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = sorted(p for p in edges if p in reach(p))
    assert not cycles, f"packages on an import cycle: {cycles}"
