"""The house's rules that import-linter does not state: no import circle anywhere in `src/`, and every package named
on docs/architecture.md's map (issue 37)."""

from __future__ import annotations

from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def import_circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every set of modules that import each other in a circle (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == module:
                    break
            if len(members) > 1:
                circles.append(sorted(members))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return circles


def test_no_module_of_taskgate_is_in_an_import_circle():
    # type-checking imports and imports inside functions count: a circle hidden in either is still one
    graph = grimp.build_graph("taskgate", exclude_type_checking_imports=False)
    assert import_circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    graph = grimp.ImportGraph()
    for module in ("a", "b", "c", "d"):
        graph.add_module(module)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    graph.add_import(importer="c", imported="a")
    graph.add_import(importer="c", imported="d")
    assert import_circles(graph) == [["a", "b", "c"]]


def test_the_architecture_map_has_a_line_for_every_package():
    packages = {
        ".".join(init.parent.relative_to(ROOT / "src").parts)
        for init in (ROOT / "src" / "taskgate").rglob("__init__.py")
        if "catalogue" not in init.parts
    }
    doc = (ROOT / "docs" / "architecture.md").read_text()
    mapped = {line.split("`")[1] for line in doc.split("## Map", 1)[1].split("\n## ", 1)[0].splitlines()
              if line.startswith("| `taskgate")}  # fmt: skip
    assert sorted(packages - mapped) == [], "packages missing from docs/architecture.md's map"
    assert sorted(mapped - packages) == [], "the map names packages that do not exist"
