"""The layer contract of heapwatch's Python code: `make lint` runs it.

Reads every import of every module with ``ast`` (imports inside functions
and under ``if TYPE_CHECKING:`` included: a lazy import is still a
dependency) and fails when a module imports one of a higher layer, one of a
sibling it must stay independent of, or when the imports form a cycle.

The layers, lowest first (docs/design/architecture.md draws them):

0. ``heapwatch._core`` (the C core) and the leaves every layer may use:
   ``heapwatch._errors``, ``heapwatch._interpreter``, ``heapwatch._version``;
1. ``heapwatch.formats``: the file formats (dumps, pprof), reports;
2. ``heapwatch.tracemalloc``: the drop-in, whose Snapshot.dump()/load()
   write and read the dump format;
3. ``heapwatch.runtime``: what every layer above runs on in the service's
   process (threads, rate-limited problems, fork hooks, the core as a
   snapshot source, the process's and the container's memory);
4. ``heapwatch.agent``: the thread, the cycle, the component interface;
5. ``heapwatch.server`` and ``heapwatch_exporters``: components of the
   agent, independent of each other;
6. ``heapwatch.cli``, ``heapwatch.__main__``, the package's public face
   (``heapwatch/__init__``) and the auto-start hook's top-level module.

A layer above the agent sees it through its front door only
(``FRONT_DOORS``): ``heapwatch.agent.interface`` (what a cycle publishes,
the protocols of its components, the process's agent: ``Agent``,
``start_agent``, ``get_agent``, ``stop_agent``, which the public face and
the exporters use) and ``heapwatch.agent.config`` (the settings), never its
other modules.  ``SIDE_DOORS`` names the one exception, with its reason.

Usage: ``python tools/check_layers.py [ROOT]`` (ROOT: the repository, by
default the one holding this file); exit status 1 with one line per problem.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

# (prefix, layer, group): a module belongs to the longest prefix that matches.
# Modules of one layer but different groups must not import each other.
LAYERS: list[tuple[str, int, str]] = [
    ("heapwatch._core", 0, "base"),
    ("heapwatch._errors", 0, "base"),
    ("heapwatch._interpreter", 0, "base"),
    ("heapwatch._version", 0, "base"),
    ("heapwatch.formats", 1, "formats"),
    ("heapwatch.dumpfile", 1, "formats"),
    ("heapwatch.tracemalloc", 2, "tracemalloc"),
    ("heapwatch._tm_snapshot", 2, "tracemalloc"),
    ("heapwatch.runtime", 3, "runtime"),
    ("heapwatch.agent", 4, "agent"),
    ("heapwatch.server", 5, "server"),
    ("heapwatch_exporters", 5, "exporters"),
    ("heapwatch.cli", 6, "cli"),
    ("heapwatch.__main__", 6, "cli"),
    ("heapwatch", 6, "face"),
    # The public way to label requests with routes (middlewares, route()):
    # the face, over the runtime's registry, as users import it directly.
    ("heapwatch.routes", 6, "face"),
    ("_heapwatch_pth", 6, "face"),
]
# Prefixes that stand for one module only, not the modules below them: a new
# module under heapwatch/ must be given its layer here.
EXACT = {"heapwatch", "_heapwatch_pth"}

# The only modules of a group that the layers above it may import.
FRONT_DOORS: dict[str, frozenset[str]] = {
    "agent": frozenset({"heapwatch.agent.interface", "heapwatch.agent.config"}),
}
# (importer, imported) past a front door.  The auto-start hook's top-level
# module imports heapwatch.agent.autostart, which reads HEAPWATCH_ENABLED
# before it imports the agent: every Python process with heapwatch installed
# and the variable set runs it, and the interface would import the whole
# agent before knowing whether to start it.
SIDE_DOORS = frozenset({("_heapwatch_pth", "heapwatch.agent.autostart")})

SOURCES = (
    ("agent", "heapwatch"),
    ("exporters", "heapwatch_exporters"),
    ("agent", "_heapwatch_pth"),
)


def layer_of(module: str) -> tuple[int, str] | None:
    best: tuple[str, int, str] | None = None
    for prefix, layer, group in LAYERS:
        below = prefix not in EXACT and module.startswith(prefix + ".")
        if (module == prefix or below) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer, group)
    return None if best is None else (best[1], best[2])


def modules(root: Path) -> dict[str, Path]:
    """Every module of heapwatch's code: its dotted name and its file."""
    found: dict[str, Path] = {}
    for base, top in SOURCES:
        single = root / base / f"{top}.py"
        if single.is_file():
            found[top] = single
            continue
        for path in sorted((root / base / top).rglob("*.py*")):
            if path.suffix not in (".py", ".pyi") or "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root / base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            if path.suffix == ".pyi" and name in found:
                continue
            found[name] = path
    # The C core has no Python source: its stub (_core.pyi) stands for it.
    return found


def imports_of(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the file, wherever it is."""
    is_package = path.stem == "__init__"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{node.module}" if node.module else package
            else:
                base = node.module or ""
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                # "from package import submodule" imports the submodule.
                yield (candidate if candidate in known else base), node.lineno


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def check(root: Path) -> list[str]:
    """One line per broken rule; empty when the contract holds."""
    found = modules(root)
    known = set(found)
    problems: list[str] = []
    graph: dict[str, set[str]] = {}
    for name, path in sorted(found.items()):
        mine = layer_of(name)
        if mine is None:
            problems.append(f"{path}: {name} belongs to no layer (tools/check_layers.py LAYERS)")
            continue
        for imported, line in imports_of(name, path, known):
            theirs = layer_of(imported)
            if theirs is None or imported == name:
                continue  # the stdlib or a third party
            if imported in known:
                graph.setdefault(name, set()).add(imported)
            where = f"{path.relative_to(root)}:{line}"
            if theirs[0] > mine[0]:
                problems.append(
                    f"{where}: {name} (layer {mine[0]}, {mine[1]}) imports {imported} "
                    f"(layer {theirs[0]}, {theirs[1]}), a higher layer"
                )
            elif theirs[0] == mine[0] and theirs[1] != mine[1] and mine[1] != "face":
                problems.append(
                    f"{where}: {name} ({mine[1]}) imports {imported} ({theirs[1]}): "
                    "siblings of one layer stay independent"
                )
            elif (
                theirs[0] < mine[0]
                and imported not in FRONT_DOORS.get(theirs[1], (imported,))
                and (name, imported) not in SIDE_DOORS
            ):
                doors = ", ".join(sorted(FRONT_DOORS[theirs[1]]))
                problems.append(
                    f"{where}: {name} imports {imported}, behind the {theirs[1]}'s front "
                    f"door: from above the {theirs[1]}, import only {doors}"
                )
    # One line per import statement and module, however many names it takes.
    problems = list(dict.fromkeys(problems))
    for cycle in _cycles(graph):
        problems.append("import cycle: " + " -> ".join(cycle))
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    problems = check(root)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        count = len(modules(root))
        print(f"layers: {count} modules, no upward import, none past a front door, no cycle")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
