"""What every MCP tool shares: the caller of a call (its principal and the services), the wrapper that turns
whatever a tool raises into a tool error that says what happened, the parameter types, and the lookups most tools
start with.

No annotation here may be a string: the SDK reads the tools' annotations at runtime.
"""

import functools
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import pydantic_core
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, Field

from taskgate.application.timestamps import parse_timestamp
from taskgate.application.workflows.engine import WorkflowEngine
from taskgate.bootstrap import App
from taskgate.domain.access import (
    AGENT_TRIGGERS,
    Capability,
    Principal,
    authorize,
)
from taskgate.domain.bounds import IDS, IntRange
from taskgate.domain.entities import Agent, Session
from taskgate.domain.errors import InvalidInput, PolicyViolation, TaskgateError, Unauthenticated
from taskgate.domain.states import Trigger
from taskgate.domain.workflows.visibility import Viewer
from taskgate.entrypoints.mcp.models import (
    SessionOut,
)
from taskgate.entrypoints.render import pull_request_json, pull_request_line

PRINCIPAL_SCOPE_KEY = "taskgate.principal"

logger = logging.getLogger(__name__)


@dataclass
class Runtime:
    """What the server's lifespan opened: the services, and who the caller is when no token says otherwise."""

    app: App
    local_principal: Principal | None


@dataclass
class Call:
    app: App
    principal: Principal


def call_of(ctx: Context) -> Call:
    runtime: Runtime = ctx.request_context.lifespan_context
    scope = getattr(ctx.request_context.request, "scope", None)
    principal = scope.get(PRINCIPAL_SCOPE_KEY) if isinstance(scope, dict) else None
    principal = principal or runtime.local_principal
    if principal is None:
        raise Unauthenticated("no principal for this call; HTTP callers need a bearer token")
    return Call(runtime.app, principal)


def _hint(exc: TaskgateError) -> str:
    if exc.wrote:  # its message says what was written (a new session cancelled because it got no worktree)
        return ""
    if isinstance(exc, PolicyViolation) and exc.session_id:
        return " The refused transition changed nothing; it is logged as blocked in the session's history."
    return " Nothing was changed."


def _refuse_nul(arguments: dict[str, Any]) -> None:
    """NUL is valid JSON but not valid text for PostgreSQL (and never meaningful here): refuse it by name."""
    for name, value in arguments.items():
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, str) and "\x00" in v for v in values):
            raise InvalidInput(f"parameter '{name}' contains a NUL character")


def tool_errors(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Every failure of the tool `fn` as a tool error that says what happened: a taskgate error as what was wrong
    (and that nothing changed), anything else as `crashed` words it, its traceback logged here. The SDK would answer
    the latter with a bare "Error executing tool X". The result is made fit for JSON (`json_safe`).

    `build_server` refuses a tool without this wrapper (`wrapped_by_tool_errors`)."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            _refuse_nul(kwargs)
            return json_safe(await fn(*args, **kwargs))
        except TaskgateError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}.{_hint(exc)}") from exc
        except (ToolError, MCPError):
            raise  # in the words the client gets already (an MCPError is answered as a protocol error)
        except Exception as exc:
            raise ToolError(crashed(fn.__name__, exc)) from exc

    wrapper.taskgate_tool_errors = True  # type: ignore[attr-defined]
    return wrapper


def wrapped_by_tool_errors(fn: Callable[..., Any]) -> bool:
    """Whether `fn` is a tool wrapped by `tool_errors`."""
    return getattr(fn, "taskgate_tool_errors", False) is True


def crashed(tool: str, exc: BaseException) -> str:
    """What the caller is told of a tool that failed in a way taskgate did not foresee (a bug, a library's own
    error), once its traceback is logged here: the exception's type and the first line of its message (a database
    error's next lines carry its SQL and parameters). Not "Nothing was changed": after a crash nobody knows."""
    logger.error("MCP tool %s failed unexpectedly", tool, exc_info=exc)
    first, _, more = str(exc).strip().partition("\n")
    detail = first[:_DETAIL_CHARS] + (" …" if more or len(first) > _DETAIL_CHARS else "")
    what = f"{type(exc).__name__}: {detail}" if first else type(exc).__name__
    stop = "" if what.endswith((".", "…")) else "."
    return (
        f"Unexpected {what}{stop} The server logged it with its traceback. Whether the call changed anything is not "
        "known: look before you retry."
    )


_DETAIL_CHARS = 500
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def json_safe(result: Any) -> Any:
    """`result`, or, when it holds lone surrogates, a copy with U+FFFD in their place: JSON cannot carry them, and
    the SDK's conversion of the result would fail. They stand for bytes that were not UTF-8: git's output (file
    names, diffs, commit messages) is decoded with surrogateescape.

    Raises: pydantic_core.PydanticSerializationError when `result` does not serialize for another reason."""
    if not isinstance(result, BaseModel):
        return result
    try:
        pydantic_core.to_json(result, fallback=str)
    except pydantic_core.PydanticSerializationError:
        return type(result).model_validate(_replace_surrogates(result.model_dump(mode="json")))
    return result


def text_safe(text: str) -> str:
    """`text` with U+FFFD for lone surrogates (bytes that were not UTF-8), as `json_safe` does for a result."""
    return _SURROGATE.sub("\N{REPLACEMENT CHARACTER}", text)


def _replace_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\N{REPLACEMENT CHARACTER}", value)
    if isinstance(value, list):
        return [_replace_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_replace_surrogates(k): _replace_surrogates(v) for k, v in value.items()}
    return value


ProjectRef = Annotated[
    str | None,
    Field(description="Project id, name or key; omit when only one project exists.", max_length=200),
]
SessionRef = Annotated[
    str, Field(description="Session id, or a unique prefix of at least 4 characters.", min_length=1, max_length=64)
]
Reason = Annotated[str | None, Field(description="Why; recorded in the transition log.", max_length=2000)]
Timestamp = Annotated[str, Field(description="ISO 8601, e.g. 2026-11-21T10:00:00Z; no zone means UTC.", max_length=64)]
WorkflowName = Annotated[str, Field(description="A workflow id (see query_workflows).", min_length=1, max_length=100)]
ChecklistName = Annotated[
    str, Field(description="A checklist id (see query_checklists).", min_length=1, max_length=100)
]
Pattern = Annotated[
    str | None,
    Field(description="A glob on the id (feature-*), or text found in the id or description.", max_length=200),
]


def within(bounds: IntRange) -> dict[str, int]:
    """The schema's bounds of an integer parameter, from domain/bounds.py: a client sees the range, and an
    argument outside it is refused as invalid arguments before the tool runs (the use case checks again)."""
    return {"ge": bounds.low, "le": bounds.high}


PlanId = Annotated[int | None, Field(description="A plan id (see plan_list).", **within(IDS))]


def parse_when(text: str | None) -> datetime | None:
    return None if text is None else parse_timestamp(text)


async def session_id_of(call: Call, ref: str, capability: Capability = Capability.READ_SESSION, trigger=None) -> str:
    """The full id of the session `ref` names, once the caller is authorised for `capability` on it.

    Raises: Forbidden, InvalidInput (a prefix too short or ambiguous), SessionNotFound (an unknown prefix)."""
    session_id = await resolved_session_id(call, ref, capability, trigger)
    if call.principal.session_id is None:  # an operator, by its roles (an agent was held to its scope above)
        await call.app.operators.authorize(call.principal, capability, session_id=session_id, trigger=trigger)
    return session_id


async def resolved_session_id(
    call: Call, ref: str, capability: Capability = Capability.READ_SESSION, trigger=None
) -> str:
    """The full id of the session `ref` names, with an agent already held to its token's scope (no I/O) and an
    operator NOT yet authorised: for a tool whose use case authorises the operator inside its own unit of work
    (`OperatorService.read_session`, `DecisionService.decide` given the principal). Every other tool calls
    `session_id_of`."""
    own = call.principal.session_id
    if own is not None:  # an agent: never resolve (and so never confirm or reveal) another session's id
        wanted = ref.strip().lower()
        reached = own if len(wanted) >= 4 and own.startswith(wanted) else None
        authorize(call.principal, capability, session_id=reached, trigger=trigger)
        return own
    return await call.app.sessions.resolve_id(ref)


async def viewer_of(call: Call) -> Viewer:
    """Who names a workflow, for its `visible_to`: the calling operator, or the calling agent by its type."""
    if call.principal.operator_id is not None:
        return Viewer.operator(call.principal.operator_id)
    return Viewer.agent(await call.app.access.agent_type(call.principal))


def workflows_of(call: Call) -> WorkflowEngine:
    if call.app.workflows is None:
        raise InvalidInput("this server runs no workflow runtime; workflows are not available here")
    return call.app.workflows


async def session_out(call: Call, session: Session, agents: list[Agent] | None = None) -> SessionOut:
    """The session with its agents and, when it runs one, its workflow stack; an agent is shown only the triggers
    it may fire (plan_complete, work_complete, fail)."""
    if agents is None:
        agents = await call.app.agents.agents(session.id) if call.app.agents is not None else []
    engine = call.app.workflows
    out = SessionOut.of(session, agents, engine.view(session) if engine and session.workflow_stack else None)
    if call.principal.operator_id is None:
        out.allowed_triggers = [t for t in out.allowed_triggers if Trigger(t) in AGENT_TRIGGERS]
    elif call.app.agents is not None:  # what its sandbox refused: for the operator, not the agents themselves
        out.sandbox = [{"kind": e["kind"], "at": str(e.get("at", "")), **e["payload"]}
                       for e in await call.app.agents.sandbox_events(session.id)]  # fmt: skip
    if out.sandbox:
        out.summary += f"; sandbox refused {len(out.sandbox)}"
    if call.app.questions is not None and (asked := await call.app.questions.open([session.id])):
        out.waiting_for_operator = [{"id": q.id, "kind": q.kind.value, "text": q.text, "choices": list(q.choices),
                                     "tool_name": q.tool_name, "tool_input": q.tool_input, "asked_by": q.asked_by,
                                     "deadline": q.deadline.isoformat()} for q in asked]  # fmt: skip
        out.summary += f"; waiting_for_operator: {len(asked)} question(s)"
    if call.app.forge is not None and (pull := await call.app.forge.pull_request(session.id)) is not None:
        out.pull_request = pull_request_json(pull)
        out.summary += f"; pull request {pull_request_line(pull)}"
    return out
