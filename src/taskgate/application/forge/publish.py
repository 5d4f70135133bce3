"""A session's branch on the forge: pushed and opened as a pull request when it is approved (and again after each
round the forge sent back), merged through the forge, its remote branch removed once merged.

These are session effects (application/sessions/effects.py), a part of the composite beside the worktrees'.
`approve` and `update_pr` push and open (or update) the pull request *after* their transition committed: the push
is outside work that a refused approval must not have done, and a crash between the transition and the push is
carried on by `resume` (an approved session whose pull request is not at its head is published again). Every step
is idempotent: the push is a lease on what taskgate pushed last (a push that landed before a crash is found
`already` there), the pull request is looked up by branch before one is opened.

The merge itself is the worktrees' `merge` effect, which asks `merge_through` first: with a forge it merges the
pull request by compare-and-swap on the approved head (GitHub's `sha`), never locally.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from taskgate.application.forge.codec import decode_observation
from taskgate.application.forge.ports import ForgeDirectory, ForgeLink, PullRequestRecord
from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.application.sessions.commands import MERGE_REQUESTED, EffectRefused, FireResult, FireTrigger
from taskgate.application.sessions.effects import NOTHING, Aftermath, NoEffects
from taskgate.application.sessions.engine import SessionService
from taskgate.domain.agents.reports import AgentReport
from taskgate.domain.entities import Project, Session
from taskgate.domain.errors import ConflictError, ForgeError, TaskgateError
from taskgate.domain.forge import PrStatus, PullRequest, pull_body, status_of
from taskgate.domain.policies.facts import TestRun
from taskgate.domain.policies.violations import Violation
from taskgate.domain.states import SessionState, Trigger
from taskgate.domain.workflows.run import FrameKind, load_stack

_log = logging.getLogger("taskgate.forge")
PULL_REQUEST = "pull_request"  # state_data key: {number, url} once opened, shown wherever the session is
FORGE = "forge"  # state_data key: {rounds: {ci, review, rebase}, round: the open round's trigger or None}
_PUBLISH_ON = frozenset({Trigger.APPROVE, Trigger.UPDATE_PR, Trigger.WORK_COMPLETE})
_MERGED_ON = frozenset({Trigger.MERGE, Trigger.FORGE_MERGED})


class ForgePublisher(NoEffects):
    """Push, open and update pull requests as session effects; tidy the remote branch after a merge."""

    def __init__(self, uow: UnitOfWorkFactory, sessions: SessionService, forges: ForgeDirectory, clock: Clock) -> None:
        self._uow, self._sessions, self._forges, self._clock = uow, sessions, forges, clock

    async def link(self, project_id: int) -> tuple[Project, ForgeLink | None]:
        """The project and its forge (None: no `[forge]`)."""
        async with self._uow(write=False) as uow:
            project = await uow.projects.get(project_id)
        return project, self._forges.for_project(project)

    # -- SessionEffects ----------------------------------------------------------------------------------------

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        trigger, session = Trigger(cmd.trigger), result.session
        if trigger not in _PUBLISH_ON | _MERGED_ON:
            return NOTHING
        project, link = await self.link(session.project_id)
        if link is None:
            return NOTHING
        if trigger in _MERGED_ON:
            await self._tidy(session, project, link)
            return NOTHING
        draft = trigger == Trigger.WORK_COMPLETE
        if draft and not (link.draft and _still_draft(session)):
            return NOTHING  # a draft is opened before the approval only; a round's fix is the forge loop's to push
        try:
            record = await self.publish(session, project, link, draft=draft)
        except TaskgateError as exc:
            return Aftermath(warning=f"the pull request was not updated yet ({exc}); taskgate tries again")
        return Aftermath(warning="" if record.error is None else record.error)

    async def resume(self, session: Session) -> Aftermath:
        """An approved session (awaiting_merge) whose push or pull request a crash cut off is published again."""
        if session.state != SessionState.AWAITING_MERGE or not session.branch_name:
            return NOTHING
        project, link = await self.link(session.project_id)
        if link is None:
            return NOTHING
        async with self._uow(write=False) as uow:
            record = await uow.pull_requests.get(session.id)
        if not owed(session, record):
            return NOTHING
        try:
            await self.publish(session, project, link)
        except ForgeError as exc:  # the forge is down at start-up: recorded on the row, the forge loop tries again
            return Aftermath(note=f"its push or pull request is owed; the forge refused ({exc}): tried again later")
        return Aftermath(note="pushed the branch and brought its pull request up to date")

    # -- publishing --------------------------------------------------------------------------------------------

    async def publish(
        self, session: Session, project: Project, link: ForgeLink, *, draft: bool = False
    ) -> PullRequestRecord:
        """Push the session's branch (a lease on what taskgate pushed last) and open its pull request (a draft
        before the approval, with `[forge] draft`), or update the open one (reopened if it was closed: the operator
        approved it again; marked ready if it was a draft). Recorded on the session's pull request row and as a
        `forge.pushed` event. Raises: ForgeError (recorded on the row first, retried by the forge loop)."""
        assert session.branch_name
        record = await self._record(session)
        if record.updated_at is None:  # the row exists from the first attempt on: the forge loop finishes a cut one
            record.status, record.updated_at = PrStatus.PUSHING.value, self._clock.now()
            await self._save(record)
        try:
            pushed = await link.pushes.push(project.root_path, session.branch_name, record.pushed)
            body = await self._body(session, link)
            pull = await self._open_or_update(session, record, link, body, draft)
            if not draft and _still_draft(session) and record.number is not None:
                await link.api.mark_ready(record.number)
        except ForgeError as exc:
            record.error, record.updated_at = f"push or pull request failed: {exc}", self._clock.now()
            await self._save(record)
            raise
        now = self._clock.now()
        record.number, record.url, record.pushed, record.pushed_at = pull.number, pull.url, pushed.sha, now
        record.status, record.observation, record.observed_at = PrStatus.CHECKS_PENDING.value, None, None
        record.error, record.poke, record.updated_at = None, True, now
        record.note = f"pushed {pushed.sha[:12]} to {session.branch_name}" + (
            " (already there)" if pushed.already else ""
        )
        await self._save(record)
        pr = {"number": pull.number, "url": pull.url, "kind": link.kind, "draft": draft}
        event = ("forge.pushed", {"branch": session.branch_name, "head": pushed.sha, "pull_request": pull.number,
                                  "url": pull.url, "created": pushed.created})  # fmt: skip
        await self._sessions.annotate(
            session.id, {PULL_REQUEST: pr, FORGE: {**forge_data(session), "round": None}}, event
        )
        return record

    async def _open_or_update(
        self, session: Session, record: PullRequestRecord, link: ForgeLink, body: str, draft: bool
    ) -> PullRequest:
        assert session.branch_name
        if record.number is not None:
            return await link.api.update_pull(record.number, body=body, reopen=record.status == PrStatus.CLOSED.value)
        found = await link.api.find_pull(session.branch_name)
        if found is not None and found.state == "open":
            return found  # opened before a crash cut the record off
        title = await self._title(session)
        return await link.api.open_pull(session.branch_name, record.base, title, body, draft=draft)

    async def _record(self, session: Session) -> PullRequestRecord:
        async with self._uow(write=False) as uow:
            record = await uow.pull_requests.get(session.id)
        if record is not None:
            return record
        base = str(session.state_data.get("base_branch") or session.state_data.get("base_ref") or "main")
        return PullRequestRecord(session.id, session.project_id, session.branch_name or "", base.split("/")[-1])

    async def _save(self, record: PullRequestRecord) -> None:
        async with self._uow(write=True) as uow:
            await self._sessions.fence(uow, record.session_id, "the pull request's row")
            await uow.pull_requests.save(record)
            await uow.commit()

    async def _title(self, session: Session) -> str:
        async with self._uow(write=False) as uow:
            task = await uow.tasks.get(session.task_id)
        return f"{task.title} ({task.id})"[:250]

    async def _body(self, session: Session, link: ForgeLink) -> str:
        """The task, the agent's final message, the checks taskgate ran, and a link to the session."""
        async with self._uow(write=False) as uow:
            task = await uow.tasks.get(session.task_id)
            agents = await uow.agents.of_session(session.id)
            runs = await uow.test_runs.of_session(session.id, limit=5)
        reports = [AgentReport.from_dict(a.report) for a in sorted(agents, key=lambda a: (a.run, a.started_at or 0))]
        final = next((r.final_message for r in reversed(reports) if r and r.final_message), "")
        checklist = "\n".join([*_checklist_lines(session), *(_test_line(run) for run in reversed(runs))])
        where = f"{link.console_url.rstrip('/')}/sessions/{session.id}" if link.console_url else f"`{session.id}`"
        return pull_body(task.title, task.description, final, checklist, where)

    async def merge_through(self, session: Session, cmd: FireTrigger) -> FireTrigger | None:
        """The `merge` effect with a forge: merge the pull request by compare-and-swap on the approved head, once
        its checks are green there; None for a project without a forge (the local merge). A pull request already
        merged (a resumed merge whose call landed before a crash) is recorded as it is.
        Raises: EffectRefused (no pull request, checks not green, the head moved, the forge refused), nothing
        written but the blocked row."""
        _, link = await self.link(session.project_id)
        if link is None:
            return None
        async with self._uow(write=False) as uow:
            record = await uow.pull_requests.get(session.id)
        head = approved_head(session)
        if record is None or record.number is None or head is None:
            raise _refused("forge_merge", f"session {session.id} has no pull request yet: approve it first", "approve")
        seen = decode_observation(record.observation) if record.observation else None
        if seen is None or not seen.pull.merged:
            status = status_of(seen, pushed=record.pushed, approved=head, limits=link.limits) if seen else None
            if status != PrStatus.MERGEABLE:
                shown = status.value if status else "not looked at yet"
                why = f"PR #{record.number} is {shown}, not mergeable on the approved head {head[:12]}"
                raise _refused("forge_checks", why, "wait for its checks; the forge loop merges it")
            try:
                commit = await link.api.merge(record.number, head, link.merge_method, await self._title(session))
            except ForgeError as exc:
                raise _refused("forge_merge", f"PR #{record.number} was not merged: {exc}", "see the PR") from None
        else:
            commit = seen.pull.merge_commit or head
        merge = {"commit": commit, "into": record.base, "via": "forge", "pull_request": record.number,
                 "mode": "no-ff" if link.merge_method == "merge" else link.merge_method, "by": cmd.actor}  # fmt: skip
        reason = cmd.reason or f"PR #{record.number} merged through the forge at {str(commit)[:12]}"
        changes = {"state_data": {"merge": merge, "merge_conflicts": None, MERGE_REQUESTED: None}}
        return replace(cmd, reason=reason, changes=changes)

    async def _tidy(self, session: Session, project: Project, link: ForgeLink) -> None:
        """After a merge: delete the pushed branch if it still points at taskgate's head (someone else's commits
        on it are kept), and fetch the base so the operator's repository sees what landed. Best effort, logged."""
        async with self._uow(write=False) as uow:
            record = await uow.pull_requests.get(session.id)
        if record is None:
            return
        try:
            if link.delete_branch and record.pushed:
                await link.pushes.delete(project.root_path, record.branch, record.pushed)
            await link.pushes.fetch(project.root_path, record.base)
        except ForgeError as exc:
            _log.warning("session %s: after the merge: %s", session.id, exc)


def owed(session: Session, record: PullRequestRecord | None) -> bool:
    """Whether an approved session still owes its push and pull request: never published, a failed push or API
    call (retried), or a transition into awaiting_merge (`approve`, `update_pr`) newer than the last publish (its
    effect is running now, maybe in another process, or a crash cut it off)."""
    if session.state != SessionState.AWAITING_MERGE:
        return False
    if record is None or record.number is None or record.error is not None or record.pushed_at is None:
        return True
    return record.pushed_at < session.updated_at or bool(forge_data(session).get("round"))


def _refused(rule: str, message: str, suggestion: str) -> EffectRefused:
    return EffectRefused(ConflictError(message), [Violation(rule, message, suggestion=suggestion)])


def _still_draft(session: Session) -> bool:
    """Whether the session's pull request is not opened yet or is the draft opened before its approval."""
    pr = session.state_data.get(PULL_REQUEST)
    return not isinstance(pr, dict) or bool(pr.get("draft"))


def approved_head(session: Session) -> str | None:
    """The head the operator approved (`state_data.approved.head`), or None before an approval."""
    approved = session.state_data.get("approved")
    return str(approved["head"]) if isinstance(approved, dict) and approved.get("head") else None


def forge_data(session: Session) -> dict[str, Any]:
    """The session's forge rounds (`state_data.forge`): {rounds: {ci, review, rebase}, round}."""
    data = session.state_data.get(FORGE)
    return dict(data) if isinstance(data, dict) else {"rounds": {}}


def _checklist_lines(session: Session) -> list[str]:
    """The checklists on the session's workflow stack, each item ticked or not."""
    lines = []
    for frame in load_stack(session.workflow_stack):
        if frame.kind is FrameKind.checklist:
            lines += [f"- [{'x' if item['id'] in frame.checked else ' '}] {item.get('text') or item['id']}"
                      for item in frame.items]  # fmt: skip
    return lines


def _test_line(run: TestRun) -> str:
    """One run of the project's tests (require_tests) as a checklist line."""
    outcome = "timed out" if run.timed_out else f"exit {run.exit_code}"
    return f"- [{'x' if run.exit_code == 0 else ' '}] `{' '.join(run.command)}` ({outcome})"


def with_forge_round(cmd: FireTrigger, session: Session, kind: str, instructions: str) -> FireTrigger:
    """`cmd` (a forge round's trigger) with the round counted and the agents' instructions, in its transition."""
    forge = forge_data(session)
    rounds = dict(forge.get("rounds") or {})
    key = {"ci_failed": "ci", "review_changes": "review", "rebase": "rebase"}[kind]
    rounds[key] = int(rounds.get(key, 0)) + 1
    data = {
        "instructions": instructions,
        "instructions_by": cmd.actor,
        FORGE: {**forge, "rounds": rounds, "round": kind},
    }
    return replace(cmd, changes={"state_data": data})
