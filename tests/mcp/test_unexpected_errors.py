"""No MCP tool answers with the SDK's bare "Error executing tool X".

The SDK answers a tool that raised anything but `ToolError` with that text alone, so the caller learns nothing. The
sweep below calls every tool the server lists, with arguments built from the tool's own input schema, under an App
whose every service raises an error taskgate did not foresee (an empty `RuntimeError`, a `KeyError`) or one it did
(`InvalidInput`): each reply must say what failed, and a crash must be logged on the server with its traceback. A
tool added later is swept as well; a schema keyword the argument builder does not know fails the sweep, naming it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import pytest
from mcp import Client
from pydantic import BaseModel

from taskgate.bootstrap import App
from taskgate.domain.access import Principal
from taskgate.domain.errors import InvalidInput
from taskgate.entrypoints.mcp import server as server_module
from taskgate.entrypoints.mcp.calls import crashed
from taskgate.entrypoints.mcp.server import build_server

ALICE = Principal.operator("alice")
NOT_SERVICES = {"settings", "database", "uow", "clock", "closers", "recovery"}


class Exploding:
    """Every service of an App at once: whatever is called on it raises a fresh `make()`, before any await, so
    sync and async methods alike; but `spared` methods answer."""

    def __init__(self, make: Callable[[], Exception], **spared: Callable[..., Any]) -> None:
        self._make, self._spared = make, spared

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def explode(*args: Any, **kwargs: Any) -> Any:
            raise self._make()

        return self._spared.get(name, explode)


async def _unregistered(principal: Principal) -> None:
    return None


def exploding_app(make: Callable[[], Exception]) -> App:
    """An App whose every service (whatever fields App has) is `Exploding(make)`. One method answers: the client
    lists the tools before calling one, and the list asks for the caller's permissions (None: every tool)."""
    services = {f.name: Exploding(make) for f in dataclasses.fields(App) if f.name not in NOT_SERVICES}
    services["operators"] = Exploding(make, permissions=_unregistered)
    return App(settings=None, **services)


def example(schema: dict[str, Any], name: str) -> Any:
    """A value valid against `schema` (the JSON-schema subset pydantic writes for taskgate's parameters).

    Raises: LookupError naming a keyword it does not know, so that a new kind of parameter is taught here rather
    than swept with an invalid value."""
    known = {"type", "anyOf", "enum", "items", "maxItems", "minItems", "maxLength", "minLength", "maximum",
             "minimum", "default", "description", "title", "additionalProperties"}  # fmt: skip
    unknown = set(schema) - known
    if unknown:
        raise LookupError(f"parameter {name!r}: no example for the schema keyword(s) {sorted(unknown)}")
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return example(next(s for s in schema["anyOf"] if s.get("type") != "null"), name)
    kind = schema.get("type")
    if kind == "string":
        if "ISO 8601" in schema.get("description", ""):
            return "2026-01-01T00:00:00Z"
        text = "sweep" * (1 + schema.get("minLength", 0) // 5)
        return text[: schema.get("maxLength", len(text))]
    if kind == "integer":
        return schema.get("minimum", 1)
    if kind == "boolean":
        return False
    if kind == "array":
        return [example(schema["items"], name)] * max(schema.get("minItems", 1), 1)
    if kind == "object":  # a free-form object (a permission prompt's tool input)
        return {"command": "sweep"}
    raise LookupError(f"parameter {name!r}: no example for type {kind!r}")


def arguments_for(input_schema: dict[str, Any]) -> dict[str, Any]:
    """Every parameter (optional ones too, so the call goes as deep as it can), each with a valid value."""
    arguments = {name: example(schema, name) for name, schema in input_schema.get("properties", {}).items()}
    jsonschema.validate(arguments, input_schema)
    return arguments


@asynccontextmanager
async def server_over(app: App, style: str) -> AsyncIterator[tuple[list[Any], Client]]:
    """The server over `app` with alice as the caller: every tool it registers (the SDK's own list, which opens no
    App) and a client connected to it."""

    @asynccontextmanager
    async def open_app() -> AsyncIterator[App]:
        yield app

    server = build_server(open_app, local_principal=ALICE, tool_names=style)
    listed = await server.list_tools()
    async with Client(server) as client:
        yield listed, client


CRASHES = {"an empty RuntimeError": RuntimeError, "a KeyError": lambda: KeyError("missing-key")}
REFUSAL = re.compile(r"[A-Z]\w+: .+\. (Nothing was changed\.|The refused transition changed nothing.*)", re.S)
"""How a taskgate error is answered (calls.tool_errors): its kind, what was wrong, and that nothing changed."""


@dataclass
class Sweep:
    """Every tool called once: which said what (`failures` holds the replies that broke the rule)."""

    tools: list[str] = field(default_factory=list)
    reached: list[str] = field(default_factory=list)  # answered with the injected error: the services were reached
    failures: list[str] = field(default_factory=list)

    def check(self) -> None:
        """No failure, and the services of nearly every tool were reached: a tool refused on its own before any
        service (session_fire refuses the trigger 'sweep') or that needs none (ping) is not swept."""
        assert not self.failures, f"{len(self.failures)} of {len(self.tools)} tools:\n" + "\n".join(self.failures)
        unswept = sorted(set(self.tools) - set(self.reached))
        assert len(self.tools) >= 50 and len(unswept) <= len(self.tools) // 10, f"not swept: {unswept}"


async def sweep(make: Callable[[], Exception], style: str, judge: Callable[[str, str, list], str | None]) -> Sweep:
    """Call every tool the server lists, under an App whose services raise `make()`. `judge(tool, rest, logged)`
    gets the text after "Error executing tool X: " and the log records whose exception is `make()`'s type; it
    returns "reached", or what is wrong with the reply."""
    sample = make()
    injected = type(sample)
    swept = Sweep()
    with _logged() as records:
        async with server_over(exploding_app(make), style) as (tools, client):
            for tool in tools:
                records.clear()
                swept.tools.append(tool.name)
                result = await client.call_tool(tool.name, arguments_for(tool.input_schema))
                if not result.is_error:
                    continue  # it needs no service (ping)
                text, prefix = result.content[0].text, f"Error executing tool {tool.name}: "
                rest = text.removeprefix(prefix).strip()
                logged = [r for r in records if r.exc_info and isinstance(r.exc_info[1], injected)]
                if not text.startswith(prefix) or not rest:
                    verdict: str | None = "a bare or empty error"
                elif REFUSAL.fullmatch(rest) and not (str(sample) and str(sample) in rest):
                    verdict = None  # refused on its own before reaching a service: a reason, not swept
                else:
                    verdict = judge(tool.name, rest, logged)
                if verdict == "reached":
                    swept.reached.append(tool.name)
                elif verdict is not None:
                    swept.failures.append(f"{tool.name}: {verdict}: {text!r}")
    return swept


@pytest.mark.parametrize("style", ["underscore", "colon"])
@pytest.mark.parametrize("crash", list(CRASHES))
async def test_every_tool_says_what_crashed_and_logs_its_traceback(crash, style):
    expected = CRASHES[crash]()
    said = f"{type(expected).__name__}: {expected}" if str(expected) else type(expected).__name__

    def judge(tool: str, rest: str, logged: list) -> str:
        if said not in rest:
            return f"does not name {said}"
        if "traceback" not in rest or "Nothing was changed" in rest:
            return "does not say it was logged, or claims nothing changed"
        return "reached" if logged else "no traceback logged"

    (await sweep(CRASHES[crash], style, judge)).check()


async def test_every_tool_still_answers_a_taskgate_refusal_in_its_own_words():
    def judge(tool: str, rest: str, logged: list) -> str:
        return "reached" if rest == "InvalidInput: the sweep refuses. Nothing was changed." else "not the refusal"

    (await sweep(lambda: InvalidInput("the sweep refuses"), "underscore", judge)).check()


@contextmanager
def _logged() -> Iterator[list[logging.LogRecord]]:
    """The records every logger sends to the root at ERROR and above, while inside."""

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    records: list[logging.LogRecord] = []
    handler, root = Keep(logging.ERROR), logging.getLogger()
    root.addHandler(handler)
    try:
        yield records
    finally:
        root.removeHandler(handler)


class Opaque(BaseModel):
    summary: str
    value: Any


async def test_a_tool_outside_tool_errors_or_a_result_the_sdk_cannot_convert_still_says_what_failed():
    """The SDK converts a tool's result after the tool returned, outside `tool_errors`: the server itself says what
    failed then, as it does for a tool registered without the wrapper."""

    @asynccontextmanager
    async def open_app() -> AsyncIterator[App]:
        yield exploding_app(RuntimeError)

    async def opaque() -> Opaque:
        return Opaque(summary="x", value=object())

    async def unwrapped() -> Opaque:
        raise ValueError("outside the wrapper")

    server = build_server(open_app, local_principal=ALICE)
    server.add_tool(opaque, name="opaque", structured_output=True)
    server.add_tool(unwrapped, name="unwrapped", structured_output=True)
    with _logged() as records:
        async with Client(server) as client:
            converted = (await client.call_tool("opaque", {})).content[0].text
            raised = (await client.call_tool("unwrapped", {})).content[0].text
    assert converted.startswith("Error executing tool opaque: Unexpected PydanticSerializationError: ")
    assert raised.startswith("Error executing tool unwrapped: Unexpected ValueError: outside the wrapper. ")
    assert "logged it with its traceback" in converted and "logged it with its traceback" in raised
    assert [type(r.exc_info[1]).__name__ for r in records if r.exc_info] == ["PydanticSerializationError", "ValueError"]


def test_a_tool_not_wrapped_by_tool_errors_is_refused_at_build_time(monkeypatch):
    async def bare() -> None: ...

    monkeypatch.setattr(server_module, "TOOLS", [*server_module.TOOLS, bare])
    with pytest.raises(TypeError, match="bare"):
        build_server(lambda: None, local_principal=None)  # type: ignore[arg-type]


def test_a_crash_is_told_by_the_first_line_of_its_message_only():
    """A database error's next lines carry its SQL and parameters: they stay in the server's log."""
    said = crashed("plan_add", RuntimeError("the driver failed\n[SQL: INSERT INTO plans ...]\n[parameters: ('x',)]"))
    assert said.startswith("Unexpected RuntimeError: the driver failed … The server logged it with its traceback.")
    assert "SQL" not in said and "parameters" not in said
    assert crashed("plan_add", RuntimeError("x" * 600)).startswith(f"Unexpected RuntimeError: {'x' * 500} …")


@pytest.mark.parametrize("crash", list(CRASHES))
async def test_every_session_resource_and_the_prompt_say_what_crashed(crash):
    """The resources and the prompt (entrypoints/mcp/session_items.py) as the tools: never the SDK's bare "Error
    reading resource", every template the server lists swept."""
    expected = CRASHES[crash]()
    said = f"{type(expected).__name__}: {expected}" if str(expected) else type(expected).__name__
    failures: list[str] = []
    with _logged() as records:
        async with server_over(exploding_app(CRASHES[crash]), "underscore") as (_tools, client):
            templates = (await client.list_resource_templates()).resource_templates
            assert len(templates) >= 3
            for template in templates:
                uri = template.uri_template.replace("{session_id}", "3f2a0000")
                try:
                    await client.read_resource(uri)
                    failures.append(f"{uri}: read without an error")
                except Exception as exc:  # the SDK raises the server's error to the client
                    if said not in str(exc) or "traceback" not in str(exc):
                        failures.append(f"{uri}: {exc}")
            try:
                await client.get_prompt("review_session", {"session_id": "3f2a0000"})
                failures.append("review_session: answered without an error")
            except Exception as exc:
                if said not in str(exc):
                    failures.append(f"review_session: {exc}")
    assert not failures, "\n".join(failures)
    assert any(r.exc_info and isinstance(r.exc_info[1], type(expected)) for r in records), "no traceback logged"
