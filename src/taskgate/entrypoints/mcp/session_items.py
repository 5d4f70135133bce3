"""What an MCP client reads or asks about a session besides the tools: resources (its diff, its transition log, its
session folder's manifest, its agents' whole outputs) and a prompt ("review session X"). Each checks the caller as
the tools do (an agent reads its own session only)."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS

from taskgate.domain.agents.transcripts import step_output
from taskgate.domain.errors import TaskgateError
from taskgate.entrypoints.mcp.calls import call_of, crashed, session_id_of, text_safe
from taskgate.entrypoints.mcp.names import renamed

SESSION_URI = "taskgate://sessions/{session_id}"


def resource_errors(fn: Callable[..., Awaitable[str]]) -> Callable[..., Awaitable[str]]:
    """Every failure as the resource error a client shows: taskgate's errors in its words, anything else as the
    tools word a crash (`crashed`: type and message, traceback logged), never the SDK's bare "Error reading
    resource". Text that was not UTF-8 (git's output, surrogate-escaped) goes out with U+FFFD."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> str:
        try:
            return text_safe(await fn(*args, **kwargs))
        except TaskgateError as exc:
            raise ResourceError(f"{type(exc).__name__}: {exc}") from exc
        except (ResourceError, MCPError):
            raise
        except Exception as exc:
            raise ResourceError(crashed(fn.__name__, exc)) from exc

    return wrapper


def prompt_errors(fn: Callable[..., Awaitable[str]]) -> Callable[..., Awaitable[str]]:
    """As `resource_errors`, for a prompt: the SDK answers anything but a protocol error raised by a prompt with a
    bare "Internal server error", so a refusal is an invalid-params error and a crash an internal error, each with
    its words."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> str:
        try:
            return text_safe(await fn(*args, **kwargs))
        except TaskgateError as exc:
            raise MCPError(INVALID_PARAMS, f"{type(exc).__name__}: {exc}") from exc
        except MCPError:
            raise
        except Exception as exc:
            raise MCPError(INTERNAL_ERROR, crashed(fn.__name__, exc)) from exc

    return wrapper


@resource_errors
async def session_diff(session_id: str, ctx: Context) -> str:
    """The session's changes against its base, as a unified diff (capped like session_review's patch)."""
    call = call_of(ctx)
    review = await call.app.workspaces.review(await session_id_of(call, session_id))
    return review.patch + ("\n(patch truncated)\n" if review.patch_truncated else "")


@resource_errors
async def session_log(session_id: str, ctx: Context) -> str:
    """The session's transition log, applied and blocked rows, oldest first: one line each."""
    call = call_of(ctx)
    sid = await session_id_of(call, session_id)
    lines = []
    for r in await call.app.sessions.history(sid, 1000):
        refused = "; ".join(g["policy"] for g in r.guard_results if not g.get("passed"))
        why = f" — {r.reason}" if r.reason else ""
        said = f" [refused by {refused}]" if refused else ""
        moved = f"{r.from_state or '-'} → {r.to_state}"
        lines.append(
            f"{r.at.isoformat(timespec='seconds')} {r.outcome.value:8} {r.trigger:16} {moved} by {r.actor}{why}{said}"
        )
    return "\n".join(lines) + "\n"


@resource_errors
async def session_manifest(session_id: str, ctx: Context) -> str:
    """The session folder's manifest.json: the files agents and operators saved, with sizes and hashes."""
    call = call_of(ctx)
    sid = await session_id_of(call, session_id)
    manifest: dict[str, Any] = await call.app.outputs.manifest(sid) if call.app.outputs is not None else {}
    return json.dumps(manifest, indent=2, ensure_ascii=True)


async def _outputs(session_id: str, ctx: Context, step: str | None) -> str:
    call = call_of(ctx)
    sid = await session_id_of(call, session_id)
    runs = await call.app.workflows.step_runs(sid, 1000) if call.app.workflows is not None else []
    agents = await call.app.agents.agents(sid) if call.app.agents is not None else []
    chosen = step_output(sid, runs, agents, step)
    return chosen[0][1] if len(chosen) == 1 else "\n\n".join(f"==> {what} <==\n{text}" for what, text in chosen)


@resource_errors
async def session_output(session_id: str, ctx: Context) -> str:
    """What the session's agents ended with, whole: the output of its latest step that ended with one (an agent
    step's final message: a plan, a review), or, without a workflow, its latest agents' results."""
    return await _outputs(session_id, ctx, None)


@resource_errors
async def session_step_output(session_id: str, step_id: str, ctx: Context) -> str:
    """The whole output of the latest run of one workflow step (e.g. the plan an approval step asks to read)."""
    return await _outputs(session_id, ctx, step_id)


@prompt_errors
async def review_session(session_id: str, ctx: Context) -> str:
    """Review a taskgate session and decide on it: its task, state, diff stat, commits and the approve policies."""
    call = call_of(ctx)
    sid = await session_id_of(call, session_id)
    session = await call.app.sessions.get(sid)
    task = await call.app.tracker.task(session.task_id)
    review = await call.app.workspaces.review(sid)
    files = "\n".join(f"  {f.path} +{f.added} -{f.deleted}" for f in review.diff_stat) or "  (no changes)"
    commits = "\n".join(f"  {c.sha[:8]} {c.subject}" for c in review.commits) or "  (no commits)"
    text = f"""Review taskgate session {sid} for task {task.id}: {task.title}
It is {session.state.value} (version {session.version}).

Files changed against {review.base_ref} ({review.ahead} commit(s) ahead, {review.behind} behind):
{files}
Commits:
{commits}

Read the whole diff (resource {SESSION_URI.format(session_id=sid)}/diff, or session_review with patch) and its
history ({SESSION_URI.format(session_id=sid)}/log). Check what the approve policies say with policies_check
(trigger approve). Then decide with project_decide: approve if the change does what the task asks and the
policies pass; request_changes with instructions naming the files and lines to change; or reject with a reason.
Task description:
{task.description or "(none)"}"""
    return renamed(text, getattr(ctx.mcp_server, "style", "underscore"))


def register(server: MCPServer) -> None:
    """Add the session resources and the review prompt to `server`."""
    base = SESSION_URI
    server.resource(f"{base}/diff", name="session_diff", title="Session diff", mime_type="text/x-diff",
                    description=session_diff.__doc__)(session_diff)  # fmt: skip
    server.resource(f"{base}/log", name="session_log", title="Session transition log", mime_type="text/plain",
                    description=session_log.__doc__)(session_log)  # fmt: skip
    server.resource(f"{base}/manifest", name="session_manifest", title="Session folder manifest",
                    mime_type="application/json", description=session_manifest.__doc__)(session_manifest)  # fmt: skip
    server.resource(f"{base}/output", name="session_output", title="Session output", mime_type="text/plain",
                    description=session_output.__doc__)(session_output)  # fmt: skip
    server.resource(f"{base}/steps/{{step_id}}/output", name="session_step_output", title="Step output",
                    mime_type="text/plain", description=session_step_output.__doc__)(session_step_output)  # fmt: skip
    server.prompt(name="review_session", title="Review a session", description=review_session.__doc__)(review_session)
