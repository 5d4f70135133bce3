"""Linear's GraphQL schema as SDL, converted from the TypeScript that graphql-codegen generated for @linear/sdk.

Linear publishes no .graphql file in its npm package, but `dist/index-*.d.mts` of @linear/sdk holds codegen's
TypeScript for the whole schema: object types (`type Issue = Node & { __typename?: "Issue"; assignee?: Maybe<User>;
… }`), interfaces (`type Node = { id: Scalars["ID"] }`, used in `&`), input types (fields `InputMaybe<…>`), field
arguments (`type IssueChildrenArgs = {…}`: `<Type><Field>Args`), enums (`declare enum X { A = "a" }`), unions
(`type X = A | B`) and custom scalars (`type Scalars = {…}`). `Maybe<T>` is a nullable T, anything else non-null;
`Array<T>` a list; a doc comment's `@deprecated reason` on an output field becomes `@deprecated(reason:)`.

What the TypeScript does not keep, and so the SDL cannot say: default values (an optional input field or argument that
is not `InputMaybe`, i.e. a non-null one with a default, becomes nullable: more permissive, never stricter), which
interfaces an interface implements (an object still lists every interface it implements), and enum value
descriptions and deprecations.

Run by hand (needs the unpacked package; `npm pack @linear/sdk@98.0.0 && tar xzf linear-sdk-98.0.0.tgz`):

    PYTHONPATH=src:. .venv/bin/python -m tests.support.linear_api.schema_from_sdk /tmp/lsdk/package \
        > tests/support/linear_api/schema.graphql

It converts everything, checks that graphql-core builds the whole schema, then writes the subset taskgate needs:
Query and Mutation with only the fields that our documents (taskgate.infrastructure.trackers.linear_documents) and the
SDK's own documents kept in sdk_documents/ select; every output type they reach with the fields those documents select
plus all its scalar and enum fields (and the fields of the interfaces it implements); every input type, enum and
scalar reachable from the kept fields' arguments, whole. `--full` prints the whole schema instead.

`--extract NAME…` prints the SDK's own document strings (`const <Name>Document = new TypedDocumentString(`…`)` in
dist/index.mjs, fragments included) for the fixtures in sdk_documents/.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import graphql
from graphql import GraphQLSchema, TypeInfo, Visitor, visit

BUILTIN = {"ID", "String", "Boolean", "Int", "Float"}
_TYPE_DECL = re.compile(r"^type (\w+) = (.*)$")
_ENUM_DECL = re.compile(r"^declare enum (\w+) \{")
_FIELD = re.compile(r"^  (\w+)(\??): (.+);$")
_ENUM_VALUE = re.compile(r'^  (\w+) = "([^"]+)",?$')


@dataclass
class Field:
    name: str
    type: str  # SDL type, e.g. "[User!]!"
    description: str | None = None
    args: list[Field] = field(default_factory=list)

    @property
    def named(self) -> str:
        return self.type.strip("[]!")


@dataclass
class TypeDef:
    kind: str  # object, interface, input, enum, union, scalar
    name: str
    description: str | None = None
    fields: list[Field] = field(default_factory=list)
    implements: list[str] = field(default_factory=list)
    values: list[str] = field(default_factory=list)  # enum values, union members


def _ts_type(expr: str, optional: bool, input_side: bool) -> str:
    """A codegen TypeScript type expression → SDL."""

    def inner(e: str) -> tuple[str, bool]:  # (sdl without outer !, nullable)
        e = e.strip()
        for wrapper in ("InputMaybe<", "Maybe<"):
            if e.startswith(wrapper) and e.endswith(">"):
                t, _ = inner(e[len(wrapper) : -1])
                return t, True
        if e.startswith("Array<") and e.endswith(">"):
            t, nullable = inner(e[6:-1])
            return f"[{t}{'' if nullable else '!'}]", False
        m = re.fullmatch(r'Scalars\["(\w+)"\](?:\["(?:input|output)"\])?', e)
        if m:
            return m.group(1), False
        if re.fullmatch(r"\w+", e):
            return e, False
        raise ValueError(f"unknown type expression {e!r}")

    sdl, nullable = inner(expr)
    if optional and input_side:
        nullable = True
    return sdl if nullable else f"{sdl}!"


def parse(dts: str) -> dict[str, TypeDef]:
    """Every schema type in codegen's declarations (the documents' result types are skipped)."""
    lines = dts.split("#endregion", 1)[0].splitlines()
    # the schema's types come first (sorted by name), then the documents' fragment, result and variables types
    first_document = next(i for i, line in enumerate(lines) if re.match(r"type \w+Fragment = ", line))
    lines = lines[:first_document]
    raw: dict[str, tuple[str, list[str], list[str], str | None]] = {}  # name → (head, body lines, &-parts, doc)
    types: dict[str, TypeDef] = {}
    doc: list[str] = []
    scalars: list[tuple[str, str | None]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("/**"):
            doc = [line]
            while not doc[-1].rstrip().endswith("*/"):
                i += 1
                doc.append(lines[i])
            i += 1
            continue
        description = _doc_text(doc)
        doc = []
        m = _ENUM_DECL.match(line)
        if m:
            values = []
            i += 1
            while lines[i] != "}":
                v = _ENUM_VALUE.match(lines[i])
                if v:
                    values.append(v.group(2))
                i += 1
            types[m.group(1)] = TypeDef("enum", m.group(1), description, values=values)
            i += 1
            continue
        m = _TYPE_DECL.match(line)
        if not m:
            i += 1
            continue
        name, rest = m.groups()
        if re.fullmatch(r"(\w+ & )*\{", rest):
            body = []
            i += 1
            while lines[i] != "};":
                body.append(lines[i])
                i += 1
            parts = [p.strip() for p in rest[:-1].split("&") if p.strip()]
            if name == "Scalars":
                scalars = _scalars(body)
            else:
                raw[name] = (rest, body, parts, description)
        elif re.fullmatch(r"[A-Z]\w*( \| [A-Z]\w*)+;", rest):
            types[name] = TypeDef("union", name, description, values=rest[:-1].split(" | "))
        i += 1
    for name, description in scalars:
        if name not in BUILTIN:
            types[name] = TypeDef("scalar", name, description)
    interfaces = {p for _, _, parts, _ in raw.values() for p in parts}
    args_types: dict[str, list[str]] = {}
    for name, (_, body, parts, description) in raw.items():
        typename = next((b for b in body if b.startswith("  __typename?: ")), None)
        if typename is not None:
            if typename != f'  __typename?: "{name}";':
                continue  # a document's result type
            kind = "object"
        elif name in interfaces:
            kind = "interface"
        elif name.endswith("Args"):
            args_types[name] = body
            continue
        else:
            kind = "input"
        fields = _fields(body, input_side=kind == "input")
        types[name] = TypeDef(kind, name, description, fields, implements=parts if kind == "object" else [])
    for t in types.values():
        if t.kind not in ("object", "interface"):
            continue
        for f in t.fields:
            body = args_types.get(f"{t.name}{f.name[0].upper()}{f.name[1:]}Args")
            if body is not None:
                f.args = _fields(body, input_side=True)
    # an `…Args` type no field claims is an input type after all (e.g. a real input named …Args)
    claimed = {
        f"{t.name}{f.name[0].upper()}{f.name[1:]}Args" for t in types.values() if t.kind in ("object", "interface")
        for f in t.fields
    }  # fmt: skip
    for name, body in args_types.items():
        if name not in claimed:
            types[name] = TypeDef("input", name, raw[name][3], _fields(body, input_side=True))
    return types


def _doc_text(doc: list[str]) -> str | None:
    if not doc:
        return None
    text = " ".join(re.sub(r"^\s*/?\*+/?\s?", "", d).removesuffix("*/").strip() for d in doc)
    return re.sub(r"\s+", " ", text).strip() or None


def _scalars(body: list[str]) -> list[tuple[str, str | None]]:
    found, doc = [], None
    for line in body:
        s = line.strip()
        if s.startswith("/**"):
            doc = _doc_text([s])
        elif m := re.match(r"(\w+): ", s):
            found.append((m.group(1), doc))
            doc = None
    return found


def _fields(body: list[str], input_side: bool) -> list[Field]:
    fields, doc = [], []
    for line in body:
        if line.strip().startswith(("/**", "*")) or (doc and not doc[-1].rstrip().endswith("*/")):
            doc.append(line)
            continue
        m = _FIELD.match(line)
        if m and m.group(1) != "__typename":
            fields.append(Field(m.group(1), _ts_type(m.group(3), m.group(2) == "?", input_side), _doc_text(doc)))
        doc = []
    return fields


# -- SDL ---------------------------------------------------------------------------------------------------------


def sdl(types: dict[str, TypeDef], keep: dict[str, set[str] | None] | None = None) -> str:
    """The types (only those in `keep`, with only its fields when a set is given) as SDL, sorted by kind and name."""
    order = {"scalar": 0, "interface": 1, "object": 2, "union": 3, "enum": 4, "input": 5}
    out = []
    for t in sorted(types.values(), key=lambda t: (order[t.kind], t.name)):
        if keep is not None and t.name not in keep:
            continue
        wanted = keep.get(t.name) if keep is not None else None
        head = _desc(t.description, "")
        if t.kind == "scalar":
            out.append(f"{head}scalar {t.name}")
        elif t.kind == "enum":
            out.append(f"{head}enum {t.name} {{\n" + "".join(f"  {v}\n" for v in t.values) + "}")
        elif t.kind == "union":
            out.append(f"{head}union {t.name} = {' | '.join(t.values)}")
        else:
            word = {"object": "type", "interface": "interface", "input": "input"}[t.kind]
            impl = [i for i in t.implements if keep is None or i in keep]
            implements = f" implements {' & '.join(impl)}" if impl else ""
            lines = [_field(f, output=t.kind != "input") for f in t.fields if wanted is None or f.name in wanted]
            out.append(f"{head}{word} {t.name}{implements} {{\n" + "\n".join(lines) + "\n}")
    return "\n\n".join(out) + "\n"


def _field(f: Field, output: bool) -> str:
    """One field; on output types, codegen's `@deprecated reason` in the doc comment becomes the directive again."""
    description, deprecated = f.description, None
    if output and description and "@deprecated" in description:
        before, _, after = description.partition("@deprecated")
        description, deprecated = before.strip() or None, after.strip() or "No longer supported"
    directive = f" @deprecated(reason: {json.dumps(deprecated)})" if deprecated else ""
    return _desc(description, "  ") + f"  {f.name}{_args(f.args)}: {f.type}{directive}"


def _desc(text: str | None, indent: str) -> str:
    return f"{indent}{json.dumps(text)}\n" if text else ""


def _args(args: list[Field]) -> str:
    if not args:
        return ""
    return "(" + ", ".join(f"{_desc(a.description, '').strip()} {a.name}: {a.type}".strip() for a in args) + ")"


# -- the subset our documents need -------------------------------------------------------------------------------


def used_fields(schema: GraphQLSchema, documents: list[str]) -> dict[str, set[str]]:
    """(type name → field names) selected by the documents, fragments included."""
    used: dict[str, set[str]] = {}
    info = TypeInfo(schema)

    class Collect(Visitor):
        def enter_field(self, node, *_):  # type: ignore[no-untyped-def]
            parent = info.get_parent_type()
            if parent is not None and not node.name.value.startswith("__"):
                used.setdefault(parent.name, set()).add(node.name.value)

    for text in documents:
        document = graphql.parse(text)
        errors = graphql.validate(schema, document)
        if errors:
            raise SystemExit(f"a document does not validate against the full schema: {errors[0]}")
        visit(document, graphql.TypeInfoVisitor(info, Collect()))
    return used


def subset(types: dict[str, TypeDef], used: dict[str, set[str]]) -> dict[str, set[str] | None]:
    """What to keep: see the module's docstring. None as fields: the whole type."""
    keep: dict[str, set[str] | None] = {}
    leaf = {n for n, t in types.items() if t.kind in ("scalar", "enum")} | BUILTIN
    todo = ["Query", "Mutation"]
    while todo:
        name = todo.pop()
        if name in BUILTIN:
            continue
        t = types[name]
        if t.kind in ("scalar", "enum", "input", "union"):
            if name not in keep:
                keep[name] = None
                if t.kind == "input":
                    todo += [f.named for f in t.fields]
                if t.kind == "union":
                    todo += t.values
            continue
        wanted = set(used.get(name, set()))
        if name not in ("Query", "Mutation"):
            wanted |= {f.name for f in t.fields if f.named in leaf and not any(a.type.endswith("!") for a in f.args)}
            for i in t.implements:
                wanted |= keep.get(i) or set()
                todo.append(i)
        before = keep.get(name)
        if before is not None and wanted <= before:
            continue
        keep[name] = (before or set()) | wanted
        for f in t.fields:
            if f.name in keep[name]:  # type: ignore[operator]
                todo.append(f.named)
                todo += [a.named for a in f.args]
        # implementors of a kept interface carry its fields: revisit kept objects that implement it
        if t.kind == "interface":
            todo += [o for o, ot in types.items() if o in keep and name in ot.implements]
    return keep


def extract_documents(index_mjs: str, names: list[str]) -> dict[str, str]:
    found = {}
    for name in names:
        m = re.search(rf"const {name}Document = new TypedDocumentString\(`(.*?)`", index_mjs, re.S)
        if m is None:
            raise SystemExit(f"no {name}Document in index.mjs")
        found[name] = m.group(1).strip() + "\n"
    return found


def main(argv: list[str]) -> None:
    package = Path(argv[0])
    if "--extract" in argv:
        names = argv[argv.index("--extract") + 1 :]
        out = Path(__file__).parent / "sdk_documents"
        for name, text in extract_documents((package / "dist" / "index.mjs").read_text(), names).items():
            (out / f"{name}.graphql").write_text(f"# @linear/sdk 98.0.0, dist/index.mjs: {name}Document\n{text}")
        return
    dts = next((package / "dist").glob("index-*.d.mts")).read_text()
    types = parse(dts)
    full = sdl(types)
    schema = graphql.build_schema(full)  # the whole conversion must build
    if "--full" in argv:
        sys.stdout.write(full)
        return
    from taskgate.infrastructure.trackers import linear_documents

    documents = list(linear_documents.ALL.values())
    documents += [p.read_text() for p in sorted((Path(__file__).parent / "sdk_documents").glob("*.graphql"))]
    keep = subset(types, used_fields(schema, documents))
    text = sdl(types, keep)
    graphql.build_schema(text)
    sys.stdout.write(
        "# Linear's GraphQL schema: a reachable subset, converted from @linear/sdk 98.0.0 (dist/index-*.d.mts, the\n"
        "# TypeScript graphql-codegen generated from Linear's schema) by tests/support/linear_api/schema_from_sdk.py.\n"
        "# Kept: Query and Mutation fields that taskgate's documents and the SDK documents in sdk_documents/ select;\n"
        "# the output types they reach, with those fields plus every scalar and enum field; reachable input types,\n"
        f"# enums and scalars whole. {len(keep)} of {len(types)} types. Do not edit: regenerate.\n\n" + text
    )


if __name__ == "__main__":
    main(sys.argv[1:])
