"""Workflow and checklist files on disk: YAML (or JSON) read with the line of every key and list item.

The catalogue has two layers (`LayeredCatalogue`): the built-in one shipped as package data
(`taskgate/catalogue/`), and the project's own under its config directory (`.taskgate/` after `taskgate init`); a
project file with the same id replaces the built-in one. Each layer is laid out the same way:

    <config>/workflows/<category>/*.yaml    workflows (`.yml` and `.json` too)
    <config>/workflows/templates/*.yaml     templates for `taskgate workflow create` (not workflows)
    <config>/checklists/*.yaml              checklists

Files are parsed with PyYAML's safe composer only (no Python objects, no tags of ours); aliases are expanded
with a size limit, so a "billion laughs" file is an error rather than a hang.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml

from taskgate.domain.workflows.definitions import Document, WorkflowProblem

SUFFIXES = (".yaml", ".yml", ".json")
BUILTIN_CATALOGUE = Path(__file__).resolve().parents[1] / "catalogue"  # package data: workflows, checklists, agents
TEMPLATES = "templates"
MAX_FILE_BYTES = 1_000_000
MAX_NODES = 100_000

Kind = Literal["workflow", "checklist"]


class _Limit(Exception):
    pass


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int, first: int) -> None:
        self.key, self.line, self.first = key, line, first


class _BadTag(Exception):
    def __init__(self, tag: str, line: int) -> None:
        self.tag, self.line = tag, line


def _to_data(root: yaml.Node) -> tuple[Any, dict[tuple[str | int, ...], int]]:
    """The Python data of a composed YAML tree, and the 1-based line of every mapping key and list item."""
    lines: dict[tuple[str | int, ...], int] = {(): root.start_mark.line + 1}
    count = 0
    constructor = yaml.SafeLoader("")

    def walk(node: yaml.Node, path: tuple[str | int, ...], active: frozenset[int]) -> Any:
        nonlocal count
        count += 1
        if count > MAX_NODES or id(node) in active or len(path) > 100:
            raise _Limit
        if isinstance(node, yaml.ScalarNode):
            if node.tag == "tag:yaml.org,2002:merge":
                raise _Limit  # `<<:` merges are not part of the format
            return constructor.construct_object(node, deep=True)
        inner = active | {id(node)}
        if node.tag not in ("tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"):
            raise _BadTag(node.tag, node.start_mark.line + 1)
        if isinstance(node, yaml.SequenceNode):
            out_list = []
            for n, item in enumerate(node.value):
                lines[(*path, n)] = item.start_mark.line + 1
                out_list.append(walk(item, (*path, n), inner))
            return out_list
        assert isinstance(node, yaml.MappingNode)
        out: dict[Any, Any] = {}
        first: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = walk(key_node, path, inner) if isinstance(key_node, yaml.ScalarNode) else "<a mapping or list>"
            line = key_node.start_mark.line + 1
            try:
                hash(key)
            except TypeError:
                key = str(key)
            if key in first:
                raise _DuplicateKey(str(key), line, first[key])
            first[key] = line
            if isinstance(key, str | int):
                lines[(*path, key)] = line
            out[key] = walk(value_node, (*path, key) if isinstance(key, str | int) else path, inner)
        return out

    try:
        return walk(root, (), frozenset()), lines
    finally:
        constructor.dispose()


def parse_text(
    text: str, file: str, *, kind: Kind = "workflow", category: str | None = None, is_json: bool = False
) -> tuple[Document | None, list[WorkflowProblem]]:
    """The document of a file's text, or None and the problem (syntax with its line, duplicate key, empty)."""
    if is_json:
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            return None, [
                WorkflowProblem(
                    file,
                    exc.lineno,
                    f"invalid JSON: {exc.msg} (column {exc.colno})",
                    "check the commas, quotes and brackets around this line",
                )
            ]
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        reason = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        return None, [
            WorkflowProblem(
                file,
                line,
                f"invalid YAML: {reason}",
                "check the indentation (spaces, not tabs), colons and quotes on this line",
            )
        ]
    except yaml.YAMLError as exc:
        return None, [WorkflowProblem(file, 1, f"invalid YAML: {exc}", "save the file as UTF-8 YAML")]
    if root is None:
        return None, [
            WorkflowProblem(
                file,
                1,
                "the file is empty",
                f"write the {kind}'s id, description and " + ("steps" if kind == "workflow" else "items"),
            )
        ]
    try:
        data, lines = _to_data(root)
    except _DuplicateKey as dup:
        return None, [
            WorkflowProblem(
                file,
                dup.line,
                f"duplicate key '{dup.key}' (also line {dup.first})",
                "each key appears once per mapping; remove or rename one",
            )
        ]
    except _BadTag as bad:
        return None, [
            WorkflowProblem(
                file, bad.line, f"unsupported tag {bad.tag}", "use plain texts, numbers, lists and mappings; no tags"
            )
        ]
    except (_Limit, RecursionError):
        return None, [
            WorkflowProblem(
                file,
                1,
                "the file is too deep, too large once aliases are expanded, recursive, or uses a '<<' merge key",
                "write the steps out without anchors, aliases and merges",
            )
        ]
    except yaml.YAMLError as exc:  # a tag the safe loader refuses (e.g. !!python/object)
        mark = getattr(exc, "problem_mark", None)
        return None, [
            WorkflowProblem(
                file,
                mark.line + 1 if mark else 1,
                f"invalid YAML value: {exc}".split("\n")[0],
                "use plain texts, numbers, lists and mappings; no tags",
            )
        ]
    return Document(file, data, lines, kind, category), []


def read_document(
    path: Path, *, kind: Kind | None = None, category: str | None = None, display: str | None = None
) -> tuple[Document | None, list[WorkflowProblem]]:
    """Read one file. `kind` defaults from where it lives (a `checklists` folder: checklist); `display` is the
    name problems use (default: the path as given)."""
    file = display or str(path)
    kind = kind or ("checklist" if path.parent.name == "checklists" else "workflow")
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            return None, [
                WorkflowProblem(
                    file,
                    1,
                    f"the file is {size} bytes, over the {MAX_FILE_BYTES} limit",
                    "split it into nested workflows",
                )
            ]
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        hint = "check the path, or see taskgate workflow list"
        return None, [WorkflowProblem(file, 1, "no such file, nor a workflow or checklist id", hint)]
    except (OSError, UnicodeDecodeError) as exc:
        return None, [WorkflowProblem(file, 1, f"cannot read the file: {exc}", "check its permissions and encoding")]
    return parse_text(text, file, kind=kind, category=category, is_json=path.suffix == ".json")


class WorkflowFiles:
    """The workflow catalogue of one config directory (the adapter behind the application's `WorkflowSource`)."""

    def __init__(self, config_dir: Path) -> None:
        self.config_dir = config_dir
        self.workflows_dir = config_dir / "workflows"
        self.checklists_dir = config_dir / "checklists"
        self.templates_dir = self.workflows_dir / TEMPLATES

    def _display(self, path: Path) -> str:
        try:
            return str(path.resolve().relative_to(Path.cwd().resolve()))
        except ValueError:
            return str(path)

    def catalogue_paths(self) -> list[tuple[Path, Kind, str | None]]:
        found: list[tuple[Path, Kind, str | None]] = []
        if self.workflows_dir.is_dir():
            # a file right in workflows/ is a workflow without a category: skipping it silently once made a user's
            # own task_ready workflow lose to the built-in one while `workflow validate` said all was well
            found += [(f, "workflow", None) for f in _files(self.workflows_dir)]
            for folder in sorted(p for p in self.workflows_dir.iterdir() if p.is_dir() and p.name != TEMPLATES):
                found += [(f, "workflow", folder.name) for f in _files(folder)]
        if self.checklists_dir.is_dir():
            found += [(f, "checklist", None) for f in _files(self.checklists_dir)]
        return found

    def catalogue(self) -> tuple[list[Document], list[WorkflowProblem]]:
        """Every workflow and checklist file of the config directory, parsed; the unreadable ones as problems."""
        documents, problems = [], []
        for path, kind, category in self.catalogue_paths():
            doc, found = read_document(path, kind=kind, category=category, display=self._display(path))
            problems += found
            if doc is not None:
                documents.append(doc)
        return documents, problems

    def read(self, path: Path) -> tuple[Document | None, list[WorkflowProblem]]:
        """One file given by the user; its category is its folder's name when it lies in the catalogue."""
        resolved = path.resolve()
        category = None
        if resolved.parent.parent == self.workflows_dir.resolve() and resolved.parent.name != TEMPLATES:
            category = resolved.parent.name
        kind: Kind = "checklist" if resolved.parent == self.checklists_dir.resolve() else "workflow"
        if kind == "workflow" and resolved.parent.name == "checklists":
            kind = "checklist"
        return read_document(path, kind=kind, category=category, display=self._display(path))

    def same_file(self, a: str, b: str) -> bool:
        return Path(a).resolve() == Path(b).resolve()

    def origin(self, file: str) -> str:
        """ "built-in" for a file of the package's catalogue, else "project"."""
        return "built-in" if Path(file).resolve().is_relative_to(BUILTIN_CATALOGUE) else "project"

    def templates(self) -> dict[str, str]:
        """Template name -> file (the templates folder)."""
        if not self.templates_dir.is_dir():
            return {}
        return {f.stem: str(f) for f in _files(self.templates_dir)}

    def template_text(self, file: str) -> str:
        return Path(file).read_text(encoding="utf-8")

    def write_workflow(self, category: str, name: str, text: str) -> str:
        """Create `<config>/workflows/<category>/<name>.yaml`. Raises: FileExistsError (never overwrites)."""
        folder = self.workflows_dir / category
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{name}.yaml"
        with open(target, "x", encoding="utf-8") as out:  # "x": refuses an existing file, atomically
            out.write(text)
        return self._display(target)

    def existing_workflow_file(self, category: str, name: str) -> str | None:
        for suffix in SUFFIXES:
            candidate = self.workflows_dir / category / f"{name}{suffix}"
            if candidate.exists():
                return self._display(candidate)
        return None


def _files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.iterdir() if f.is_file() and f.suffix in SUFFIXES and not f.name.startswith("."))


class LayeredCatalogue:
    """The built-in catalogue under the project's own (the adapter behind `WorkflowSource`). A project file whose id
    is also a built-in one replaces it; new workflows are written into the project's layer only."""

    def __init__(self, project_dir: Path, builtin_dir: Path = BUILTIN_CATALOGUE) -> None:
        self.builtin, self.project = WorkflowFiles(builtin_dir), WorkflowFiles(project_dir)
        self.config_dir = project_dir
        # the built-in layer is the project's own when the config points at the package (nothing to layer)
        self._layered = builtin_dir.resolve() != project_dir.resolve()

    def catalogue(self) -> tuple[list[Document], list[WorkflowProblem]]:
        """Every file of both layers, parsed; a built-in file whose (kind, id) the project defines is left out."""
        own, own_problems = self.project.catalogue()
        if not self._layered:
            return own, own_problems
        base, base_problems = self.builtin.catalogue()
        taken = {(d.kind, d.declared_id) for d in own if d.declared_id}
        kept = [d for d in base if (d.kind, d.declared_id) not in taken]
        return [*kept, *own], [*base_problems, *own_problems]

    def origin(self, file: str) -> str:
        return self.project.origin(file)

    def read(self, path: Path) -> tuple[Document | None, list[WorkflowProblem]]:
        return self.project.read(path)

    def same_file(self, a: str, b: str) -> bool:
        return self.project.same_file(a, b)

    def templates(self) -> dict[str, str]:
        """Template name -> file; a project template replaces the built-in one of the same name."""
        return {**self.builtin.templates(), **self.project.templates()} if self._layered else self.project.templates()

    def template_text(self, file: str) -> str:
        return self.project.template_text(file)

    def existing_workflow_file(self, category: str, name: str) -> str | None:
        return self.project.existing_workflow_file(category, name)

    def write_workflow(self, category: str, name: str, text: str) -> str:
        return self.project.write_workflow(category, name, text)

    def folders(self) -> dict[str, str]:
        """Where each layer's workflows and checklists live (for `taskgate info`)."""
        return {
            "builtin_catalogue": str(self.builtin.config_dir),
            "project_workflows": str(self.project.workflows_dir),
            "project_checklists": str(self.project.checklists_dir),
        }
