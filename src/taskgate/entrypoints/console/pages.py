"""The console's pages (GET): board, session, diff review, audit and its exports. Each reads through the same use
cases as the MCP tools and checks the same capability first (`project_ready_tasks`/READ for the board,
`session_status`/READ_SESSION for a session, `session_review` for the diff, `audit_query`/AUDIT for the audit, whose
proofs are `audit_status`'s)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from taskgate.application.board import PAGE_SIZE, BoardFilter, ColumnPage
from taskgate.application.sessions.ports import TransitionQuery
from taskgate.application.timestamps import parse_timestamp
from taskgate.bootstrap import App
from taskgate.domain.access import Capability
from taskgate.domain.agents.transcripts import result_of
from taskgate.domain.errors import InvalidInput, NotFound
from taskgate.domain.session_fsm import allowed_triggers
from taskgate.entrypoints.agent_lines import readable_log, usage_lines
from taskgate.entrypoints.console.diff_view import parse_patch
from taskgate.entrypoints.console.web import SECURITY_HEADERS, Console, Visit, page
from taskgate.entrypoints.render import jsonable, sandbox_lines, transitions_csv

AUDIT_LIMIT = 1000
LOGS_SHOWN = 12  # the session page shows the logs of its last agents (the others: `taskgate session logs`)


def routes(console: Console) -> dict[str, Any]:
    """Path → endpoint for every page."""

    @page(console)
    async def board(v: Visit) -> Response:
        await v.app.operators.authorize(v.principal, Capability.READ)
        q = v.request.query_params
        projects = [p for p in await v.app.tracker.list_projects() if p.archived_at is None]
        if not projects:
            return v.page("empty.html")
        project = await v.app.tracker.resolve_project(q.get("project") or projects[0].name)
        filters = BoardFilter(_int(q.get("plan"), "plan"), q.get("operator") or None)
        paged = _column_page(q.get("column"), q.get("page"))
        mark = await console.feed.current()  # before the reads: a write between them still refreshes the page
        shown = await console.board_query().board(project.id, filters, paged)
        template = "_board.html" if v.request.headers.get("x-console-live") else "board.html"
        # the cards whose agents wait on an answer (the sub-state waiting_for_operator): few, read in one query
        asking = {q.session_id for q in await v.app.questions.open()} if v.app.questions is not None else set()
        return v.page(template, board=shown, projects=projects, mark=mark, may_start=await v.may(Capability.START),
                      asking=asking, page_link=_page_link(project.name, filters), page_size=PAGE_SIZE)  # fmt: skip

    @page(console)
    async def session(v: Visit) -> Response:
        sid = await _session_id(v, Capability.READ_SESSION)
        # The live feed's mark is read BEFORE the page's reads: a write committed between the session read and the
        # step runs' read (the workflow engine opening an approval) is then past the mark and refreshes the page;
        # read after, the page kept the half-old view (the stack still `pending`) and never refreshed.
        mark = await console.feed.current()
        values = await _session_values(v, sid)
        template = "_session.html" if v.request.headers.get("x-console-live") else "session.html"
        return v.page(template, mark=mark, **values)

    @page(console)
    async def review(v: Visit) -> Response:
        sid = await _session_id(v, Capability.READ_SESSION)
        session = await v.app.sessions.get(sid)
        workspace = await v.app.workspaces.review(sid)
        files = parse_patch(workspace.patch)
        view = "split" if v.request.query_params.get("view") == "split" else "unified"
        task = await v.app.tracker.task(session.task_id)
        return v.page("review.html", session=session, task=task, review=workspace, files=files, view=view,
                      may_decide=await v.may(Capability.DECIDE, sid),
                      may_override=await v.may(Capability.OVERRIDE, sid))  # fmt: skip

    @page(console)
    async def audit(v: Visit) -> Response:
        records, query = await _audit_rows(v)
        fmt = v.request.path_params.get("fmt")
        if fmt == "csv":
            return Response(transitions_csv(records), media_type="text/csv", headers=_download("audit.csv"))
        if fmt == "json":
            body = json.dumps(jsonable(records), indent=2, ensure_ascii=False)
            return Response(body, media_type="application/json", headers=_download("audit.json"))
        return v.page(
            "audit.html",
            records=records,
            query=dict(v.request.query_params),
            limit=query.limit,
            export_query=urlencode([(k, x) for k, x in v.request.query_params.multi_items() if x]),
            **await _proofs(v.app),
        )

    @page(console)
    async def agent_log(v: Visit) -> Response:
        """An agent's log as it wrote it (text/plain: a browser shows it, never runs it)."""
        sid = await _session_id(v, Capability.READ_SESSION)
        wanted = v.request.path_params["aid"]
        agent = next((a for a in await v.app.agents.agents(sid) if a.id == wanted), None) if v.app.agents else None
        if agent is None or not agent.output_path:
            raise NotFound(f"session {sid[:8]} has no agent {wanted[:36]!r} with a log")
        try:
            with open(agent.output_path, "rb") as log:
                body = log.read()
        except OSError:
            body = b""
        return Response(body, media_type="text/plain; charset=utf-8", headers=SECURITY_HEADERS)

    @page(console)
    async def tracker(v: Visit) -> Response:
        """Each project's last tracker poll and what dispatch did with its ready issues (`taskgate tracker status`)."""
        await v.app.operators.authorize(v.principal, Capability.READ)
        return v.page("tracker.html", polls=await v.app.tracker.polls())

    return {"/": board, "/sessions/{sid}": session, "/sessions/{sid}/review": review, "/audit": audit,
            "/audit.{fmt}": audit, "/sessions/{sid}/agents/{aid}/log": agent_log, "/tracker": tracker}  # fmt: skip


async def _session_id(v: Visit, capability: Capability) -> str:
    sid = await v.app.sessions.resolve_id(v.request.path_params["sid"])
    await v.app.operators.authorize(v.principal, capability, session_id=sid)
    return sid


async def _session_values(v: Visit, sid: str) -> dict[str, Any]:
    """What the session page shows: state, task, timeline, workflow stack, agents, outputs, the approve dry run."""
    app = v.app
    session = await app.sessions.get(sid)
    task = await app.tracker.task(session.task_id)
    agents = await app.agents.agents(sid) if app.agents is not None else []
    stack = app.workflows.view(session) if app.workflows is not None and session.workflow_stack else None
    check = None
    if session.state.value == "verifying":  # the approve policies as this operator would meet them (no test run)
        check = await app.sessions.check(sid, "approve", actor=v.principal.actor, run_tests=False)
    outputs = (await app.outputs.manifest(sid)).get("outputs", []) if app.outputs is not None else []
    owed = await app.writebacks.open_rows([session.task_id]) if app.writebacks is not None else []
    steps = await app.workflows.step_runs(sid) if app.workflows is not None else []
    return {
        "session": session, "task": task, "history": await app.sessions.history(sid, 500), "agents": agents,
        "stack": stack, "check": check, "outputs": outputs, "owed": owed, "steps": steps,
        "step_latest": {r.step_id: r.id for r in steps},  # a step's latest run holds its output now
        "logs": {a.id: readable_log(a.output_path) for a in agents[-LOGS_SHOWN:]},
        "results": {a.id: result_of(a) for a in agents}, "usage": usage_lines(agents),
        "sandbox": sandbox_lines(await app.agents.sandbox_events(sid)) if app.agents is not None else [],
        "pull_request": await app.forge.pull_request(sid) if app.forge is not None else None,
        "triggers": allowed_triggers(session.state, session.prior_state),
        "questions": await app.questions.open([sid]) if app.questions is not None else [],
        "may_decide": await v.may(Capability.DECIDE, sid), "may_fire": await v.may(Capability.FIRE, sid),
        "may_override": await v.may(Capability.OVERRIDE, sid), "may_steer": await v.may(Capability.STEER, sid),
    }  # fmt: skip


async def _audit_rows(v: Visit) -> tuple[list[Any], TransitionQuery]:
    await v.app.operators.authorize(v.principal, Capability.AUDIT)
    q = v.request.query_params
    sid = await v.app.sessions.resolve_id(q["session"]) if q.get("session") else None
    outcome = q.get("outcome") or None
    if outcome not in (None, "applied", "blocked"):
        raise InvalidInput(f"outcome must be applied or blocked, not {outcome!r}")
    query = TransitionQuery(sid, q.get("actor") or None, q.get("state") or None, outcome, _when(q.get("since")),
                            _when(q.get("until")), _int(q.get("limit"), "limit") or AUDIT_LIMIT)  # fmt: skip
    return await v.app.audit.transitions(query), query


async def _proofs(app: App) -> dict[str, Any]:
    """What the audit page shows of the log's proofs: `audit_status`'s use case, its times as datetimes. A key file
    that cannot be read is shown there (`proofs_error`) rather than taking the transition log down with it."""
    if app.ledger is None:
        return {"proofs": None, "proofs_error": None}
    try:
        status = await app.ledger.status()
    except InvalidInput as exc:
        return {"proofs": None, "proofs_error": f"{type(exc).__name__}: {exc}"}
    timed = {part: _timed(status[part]) for part in ("last_checkpoint", "last_verified")}
    return {"proofs": {**status, **timed}, "proofs_error": None}


def _timed(part: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if part is None else {**part, "at": datetime.fromisoformat(part["at"])}


def _when(text: str | None) -> Any:
    return parse_timestamp(text) if text else None


def _int(text: str | None, name: str) -> int | None:
    if not text:
        return None
    if not text.isdigit() or len(text) > 9:
        raise InvalidInput(f"{name} must be a whole number, not {text!r}")
    return int(text)


def _column_page(column: str | None, page: str | None) -> ColumnPage | None:
    """The `column` and `page` of the board's address. Raises: InvalidInput (a page that is not a whole number, a
    page without its column or the other way round)."""
    if not column and not page:
        return None
    if not column or not page:
        raise InvalidInput("a board page needs both `column` and `page` (e.g. ?column=executing&page=2)")
    return ColumnPage(column, _int(page, "page") or 0)


def _page_link(project: str, filters: BoardFilter) -> Callable[[str, int], str]:
    """The board's address with page `n` of column `key` (the project and filters kept), at that column."""
    kept = [("project", project), ("plan", filters.plan_id), ("operator", filters.operator_id)]

    def link(key: str, n: int) -> str:
        pairs = [(k, x) for k, x in kept if x is not None] + ([("column", key), ("page", n)] if n > 1 else [])
        return f"/?{urlencode(pairs)}#col-{key}"

    return link


def _download(name: str) -> dict[str, str]:
    return {**SECURITY_HEADERS, "content-disposition": f'attachment; filename="{name}"'}


def signin_page(console: Console, request: Request, error: str | None = None, status: int = 200) -> Response:
    """The sign-in form (no sign-in needed to see it)."""
    return console.render("signin.html", status, error=error, next=request.query_params.get("next", "/"), me=None,
                          csrf="", flash=[], path="/signin")  # fmt: skip
