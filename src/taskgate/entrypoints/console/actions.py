"""The console's actions (POST): sign in and out, start a task, decide, fire a session trigger, tick a checklist
item. Each is the MCP tool of the same purpose in another dress: the same capability check, the same use case
(`StartTask` + `execute`, `Decide`, `FireTrigger`, `WorkflowEngine.check_item`), so a refusal is the same refusal
and nothing is written when one comes back.
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from taskgate.application.operators.decisions import Decide
from taskgate.application.sessions.commands import FireTrigger, StartTask, parse_trigger
from taskgate.domain.access import DECISION_TRIGGERS, Capability, check_operator_param
from taskgate.domain.errors import InvalidInput, TaskgateError, Unauthenticated
from taskgate.domain.workflows.visibility import Viewer
from taskgate.entrypoints.console.pages import signin_page
from taskgate.entrypoints.console.signins import COOKIE
from taskgate.entrypoints.console.web import Console, Visit, _local, _same_origin, action

FIRED_HERE = frozenset({"merge", "suspend", "resume", "cancel", "retry"})
MAX_COMMENTS = 200
MAX_TEXT = 5000


def routes(console: Console) -> dict[str, Any]:
    """Path → endpoint for every action."""

    async def sign_in(request: Request) -> Response:
        if request.method == "GET":
            return signin_page(console, request)
        form = await request.form()
        if not _same_origin(request):
            return signin_page(console, request, "this sign-in did not come from the console's own page", 403)
        if form.get("code") is not None:  # a one-time link from `taskgate console`
            token = console.sign_ins.redeem(str(form.get("code")))
            if token is None:
                return signin_page(console, request, "this sign-in link was used already or has expired", 401)
        else:
            token = str(form.get("token") or "").strip()
        try:
            app = console.services()
            principal = await app.access.authenticate(token or None)
            cookie, _ = console.sign_ins.open(token, principal)
            await app.operators.authorize(principal, Capability.READ)
        except (Unauthenticated, TaskgateError) as exc:
            return signin_page(console, request, str(exc), 401)
        response = RedirectResponse(_local(str(form.get("next") or "/"), "/"), status_code=303)
        secure = request.url.scheme == "https"
        response.set_cookie(COOKIE, cookie, httponly=True, samesite="strict", secure=secure, path="/")
        return response

    async def sign_in_link(request: Request) -> Response:
        """The page a one-time link opens: a button that spends the code (a GET never does, so a link preview
        or prefetch cannot use it up)."""
        return console.render("signin_link.html", code=request.query_params.get("code", ""), me=None, csrf="",
                              flash=[], path="/signin/link")  # fmt: skip

    @action(console)
    async def sign_out(v: Visit) -> Response:
        console.sign_ins.close(v.request.cookies.get(COOKIE))
        response = RedirectResponse("/signin", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @action(console)
    async def start(v: Visit) -> Response:
        task_id = v.request.path_params["task_id"]
        form = await v.request.form()
        await v.app.operators.authorize(v.principal, Capability.START)
        engine = v.app.workflows
        chosen = engine.chosen(None, Viewer.operator(v.principal.subject)) if engine is not None else None
        operator = check_operator_param(v.principal, None)
        session = (await v.app.sessions.start_task(StartTask(task_id, v.principal.actor, operator))).session
        if engine is not None:
            await engine.attach(session.id, chosen, v.principal.actor)
        note = f"started {task_id}: session {session.id[:8]} is planning"
        if form.get("run") and v.app.agents is not None:
            await v.app.agents.execute(session.id, v.principal.actor, [])
            note = f"started {task_id}: session {session.id[:8]} is executing, its agents run"
        return v.back("/", note)  # shown on top: the task has left the ready list

    @action(console)
    async def decide(v: Visit) -> Response:
        sid = await _session(v, Capability.DECIDE)
        form = await v.request.form()
        decision = _one_of(form, "decision", ("approve", "request_changes", "reject"))
        overrides = tuple(str(p) for p in form.getlist("override") if p)
        compensation = (_text(form, "compensation") or None) if decision == "reject" else None
        assert v.principal.operator_id is not None  # agents cannot sign in
        cmd = Decide(sid, v.principal.operator_id, decision, _text(form, "reason") or None,
                     _instructions(form) or None, overrides, compensation, _version(form))  # fmt: skip
        outcome = await v.app.decisions.decide(cmd)
        return v.back(f"/sessions/{sid}", f"{decision.replace('_', ' ')}: session is {outcome.session.state.value}")

    @action(console)
    async def fire(v: Visit) -> Response:
        form = await v.request.form()
        trigger = _one_of(form, "trigger", tuple(sorted(FIRED_HERE)))
        sid = await _session(v, Capability.FIRE, trigger)
        cmd = FireTrigger(sid, trigger, v.principal.actor, _text(form, "reason") or None, _version(form))
        result = await v.app.sessions.fire(cmd)
        return v.back(f"/sessions/{sid}", f"{trigger}: session is {result.session.state.value}")

    @action(console)
    async def check_item(v: Visit) -> Response:
        sid = await _session(v, Capability.STEER)
        if v.app.workflows is None:
            raise InvalidInput("this server runs no workflow runtime")
        item = _text(form := await v.request.form(), "item")
        if not item:
            raise InvalidInput("no checklist item named")
        await v.app.workflows.check_item(sid, item, v.principal.actor)
        del form
        return v.back(f"/sessions/{sid}", f"ticked {item}")

    @action(console)
    async def answer(v: Visit) -> Response:
        """Answer an agent's question (session_answer): the waiting agent gets it within [questions] poll_s."""
        sid = await _session(v, Capability.DECIDE)
        form = await v.request.form()
        if v.app.questions is None:
            raise InvalidInput("this server has no question service")
        given, message = _text(form, "answer"), _text(form, "message") or None
        ended = await v.app.questions.answer(v.principal, _text(form, "question") or None, sid, given, message)
        return v.back(f"/sessions/{sid}", f"question {ended.id}: answered {ended.answer}")

    @action(console)
    async def writeback(v: Visit) -> Response:
        """Retry or dismiss a write-back owed to the tracker for this session's task (tracker_retry/_dismiss)."""
        form = await v.request.form()
        what = _one_of(form, "do", ("retry", "dismiss"))
        sid = await _session(v, Capability.FIRE if what == "retry" else Capability.DECIDE)
        row_id = _version(form, "writeback")
        if row_id is None or v.app.writebacks is None:
            raise InvalidInput("no write-back named")
        if what == "dismiss":
            await v.app.writebacks.dismiss(row_id, v.principal.actor, _text(form, "reason"))
            return v.back(f"/sessions/{sid}", f"write-back #{row_id} dismissed")
        attempt = await v.app.writebacks.retry(row_id, v.principal.actor)
        note = "written" if attempt.ok else f"failed again: {attempt.error}"
        return v.back(f"/sessions/{sid}", f"write-back #{row_id} {note}")

    return {
        "/signin": sign_in, "/signin/link": sign_in_link, "/signout": sign_out, "/tasks/{task_id}/start": start,
        "/sessions/{sid}/decide": decide, "/sessions/{sid}/writeback": writeback,
        "/sessions/{sid}/fire": fire, "/sessions/{sid}/check": check_item, "/sessions/{sid}/answer": answer,
    }  # fmt: skip


async def _session(v: Visit, capability: Capability, trigger: str | None = None) -> str:
    sid = await v.app.sessions.resolve_id(v.request.path_params["sid"])
    parsed = parse_trigger(trigger) if trigger else None
    await v.app.operators.authorize(v.principal, capability, session_id=sid, trigger=parsed)
    if parsed in DECISION_TRIGGERS:
        raise InvalidInput("decisions go through the decide form")
    return sid


def _text(form: FormData, name: str) -> str:
    value = form.get(name)
    text = value if isinstance(value, str) else ""
    if len(text) > MAX_TEXT or "\x00" in text:
        raise InvalidInput(f"{name} is longer than {MAX_TEXT} characters or holds a NUL character")
    return text.strip()


def _one_of(form: FormData, name: str, allowed: tuple[str, ...]) -> str:
    value = _text(form, name)
    if value not in allowed:
        raise InvalidInput(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    return value


def _version(form: FormData, name: str = "expected_version") -> int | None:
    text = _text(form, name)
    if not text:
        return None
    if not text.isdigit() or len(text) > 9:
        raise InvalidInput(f"{name} must be a whole number, not {text!r}")
    return int(text)


def _instructions(form: FormData) -> str:
    """The operator's general instructions, then one line per line comment: `path:line: text`."""
    files, lines, texts = form.getlist("comment_file"), form.getlist("comment_line"), form.getlist("comment_text")
    if not (len(files) == len(lines) == len(texts)) or len(texts) > MAX_COMMENTS:
        raise InvalidInput("the line comments came incomplete; reload the review and comment again")
    parts = [_text(form, "instructions")] if _text(form, "instructions") else []
    for path, line, text in zip(files, lines, texts, strict=True):
        if str(text).strip():
            parts.append(f"{str(path).strip()}:{str(line).strip()}: {str(text).strip()}")
    joined = "\n".join(parts)
    if len(joined) > MAX_TEXT:
        raise InvalidInput(f"the instructions and comments come to {len(joined)} characters; at most {MAX_TEXT}")
    return joined
