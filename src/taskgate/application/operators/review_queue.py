"""What waits for an operator: sessions in verifying, each with what a decision needs to know.

For every session waiting in `verifying` (escalated ones first, see docs/sweeper.md, then oldest first): the
diff stat and commits of its branch, the stored test run of its head (the command is not run here), the dry-run
result of the policies that guard `approve` as the caller would meet them, and the approvals already counted.
Sessions the caller has already decided (e.g. approved, waiting for a second reviewer) are left out: they wait
for someone else.

Sessions whose workflow waits on an approval step (state `executing`) are listed too, with the step and its
message; `project_decide` answers the step. The approve policies guard verifications, not steps, so those
items carry no dry run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from taskgate.application.ports import UnitOfWorkFactory
from taskgate.application.sessions.engine import SessionService
from taskgate.application.sessions.guards import PolicyCheck
from taskgate.application.workflows.engine import WorkflowEngine
from taskgate.application.workspaces.ports import WorkspaceContext
from taskgate.application.workspaces.worktrees import WorkspaceService
from taskgate.domain.entities import Session
from taskgate.domain.errors import TaskgateError
from taskgate.domain.states import SessionState


@dataclass(frozen=True, slots=True)
class ReviewItem:
    session: Session
    review: WorkspaceContext | None
    review_error: str | None
    check: PolicyCheck | None
    check_error: str | None
    approvals: list[str]
    approval_step: str | None = None  # the workflow approval step the session waits on (state executing)
    message: str | None = None  # that step's message


class ReviewQueue:
    """The `project_sessions_ready` use case."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        sessions: SessionService,
        workspaces: WorkspaceService,
        workflows: WorkflowEngine | None = None,
    ) -> None:
        self._uow, self._sessions, self._workspaces = uow, sessions, workspaces
        self._workflows = workflows

    def use_workflows(self, workflows: WorkflowEngine) -> None:
        """List sessions waiting on workflow approval steps too (the composition root attaches it)."""
        self._workflows = workflows

    async def waiting(self, project_id: int, actor: str) -> list[ReviewItem]:
        """Sessions of the project waiting for `actor`'s decision, escalated first, then oldest first.

        Raises: ProjectNotFound."""
        states = {SessionState.VERIFYING} | ({SessionState.EXECUTING} if self._workflows is not None else set())
        waiting = await self._sessions.list_sessions(project_id, states)
        operator_id = actor.removeprefix("operator:")
        items = []
        for session in sorted(waiting, key=lambda s: (s.escalated_at is None, s.updated_at, s.id)):
            step = None
            if session.state == SessionState.EXECUTING:
                assert self._workflows is not None
                if (step := self._workflows.approval_step(session)) is None:
                    continue
            async with self._uow(write=False) as uow:
                taken = await uow.decisions.for_verification(session.id, session.version)
            if any(d.operator_id == operator_id for d in taken):
                continue
            item = await self._item(session, actor, sorted(d.operator_id for d in taken), checked=step is None)
            items.append(item if step is None else replace(item, approval_step=step.id, message=step.message))
        return items

    async def _item(self, session: Session, actor: str, approvals: list[str], *, checked: bool) -> ReviewItem:
        review, review_error = None, None
        try:
            review = await self._workspaces.review(session.id)
        except TaskgateError as exc:  # no worktree, branch gone: show the session anyway, with why
            review_error = str(exc)
        check, check_error = None, None
        try:
            if checked:
                check = await self._sessions.check(session.id, "approve", actor=actor, run_tests=False)
        except TaskgateError as exc:
            check_error = str(exc)
        return ReviewItem(session, review, review_error, check, check_error, approvals)
