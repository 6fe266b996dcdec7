"""The package layout docs/architecture.md describes, checked on the source: every module lives in a
package the document names, no module imports another that imports it back, and `core` (what every package
uses) imports no other package of the service when it loads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "gasless"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _load_time_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The service's modules `name` imports while it loads: imports at module level, in a module-level `if` or
    `try` too, but not under `if TYPE_CHECKING:` nor inside a function (those run later, once all are loaded)."""
    imported: set[str] = set()
    for statement in ast.parse(path.read_text()).body:
        if isinstance(statement, ast.If) and "TYPE_CHECKING" in ast.unparse(statement.test):
            continue
        nodes = ast.walk(statement) if isinstance(statement, ast.If | ast.Try) else [statement]
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module)
                imported.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    return {module for module in imported if module in modules and module != name}


def _import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_every_module_lives_in_a_package_the_architecture_names() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"modules at the top of src/gasless, outside any package: {loose}"
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    table = [
        line.split("|")[1]
        for line in (ROOT / "docs" / "architecture.md").read_text().splitlines()
        if line.startswith("| `")
    ]
    documented = {name for cell in table for name in re.findall(r"`([a-z0-9_]+)/`", cell)}
    assert [p for p in packages if p not in documented] == [], "packages docs/architecture.md does not name"
    assert sorted(documented - set(packages)) == [], "docs/architecture.md names packages that do not exist"


def test_no_module_imports_one_that_imports_it_back() -> None:
    modules = _modules()
    graph = {name: _load_time_imports(name, path, modules) for name, path in modules.items()}
    assert sum(len(edges) for edges in graph.values()) > 1000  # the walk sees the service's imports
    assert _import_circles(graph) == []


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _import_circles(graph) == [["a", "b", "c"]]


def test_core_loads_without_any_other_package_of_the_service() -> None:
    modules = _modules()
    outside = {
        f"{name} -> {imported}"
        for name, path in modules.items()
        if name.startswith("gasless.core")
        for imported in _load_time_imports(name, path, modules)
        if not imported.startswith("gasless.core") and imported != "gasless"
    }
    assert sorted(outside) == []


def test_the_http_platform_and_the_limits_depend_on_no_domain() -> None:
    """`http` and `limits` load with `core`, `db` and `chain`'s formats only (docs/architecture.md)."""
    modules = _modules()
    allowed = ("gasless.core", "gasless.http", "gasless.limits", "gasless.db", "gasless.chain")
    outside = {
        f"{name} -> {imported}"
        for name, path in modules.items()
        if name.startswith(("gasless.http", "gasless.limits"))
        for imported in _load_time_imports(name, path, modules)
        if not imported.startswith(allowed) and imported != "gasless"
    }
    assert sorted(outside) == []
