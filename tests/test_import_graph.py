"""The runtime's modules import each other without cycles (read from their source, nothing imported)."""

from pathlib import Path

from build_tools.imports import imported_names

RUNTIME = Path(__file__).resolve().parent.parent / "tkaot"


def _module_name(path: Path) -> str:
    parts = path.relative_to(RUNTIME.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The tkaot modules a file imports at module level or inside functions (either can close a cycle at run time)."""
    return imported_names(path) & modules


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(trail[trail.index(nxt) :] + [nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return cycles


def test_the_cycle_finder_finds_cycles():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycles_in_the_runtime():
    files = {_module_name(p): p for p in RUNTIME.rglob("*.py")}
    graph = {name: _imports(path, set(files)) - {name} for name, path in files.items()}
    # a package's __init__ is imported by each of its modules; only a module naming another counts as an edge
    for name in graph:
        graph[name] -= {p for p in files if name.startswith(p + ".")}
    assert sum(map(len, graph.values())) > 20  # the graph was read
    assert not find_cycles(graph), f"import cycles: {find_cycles(graph)}"
