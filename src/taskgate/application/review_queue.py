"""What waits for an operator: sessions in verifying, each with what a decision needs to know.

For every session waiting in `verifying` (oldest first): the diff stat and commits of its branch, the stored
test run of its head (the command is not run here), the dry-run result of the policies that guard `approve`
as the caller would meet them, and the approvals already counted. Sessions the caller has already decided
(e.g. approved, waiting for a second reviewer) are left out: they wait for someone else.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskgate.application.guards import PolicyCheck
from taskgate.application.ports import UnitOfWorkFactory, WorkspaceContext
from taskgate.application.sessions import SessionService
from taskgate.application.workspaces import WorkspaceService
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


class ReviewQueue:
    """The `project_sessions_ready` use case."""

    def __init__(self, uow: UnitOfWorkFactory, sessions: SessionService, workspaces: WorkspaceService) -> None:
        self._uow, self._sessions, self._workspaces = uow, sessions, workspaces

    async def waiting(self, project_id: int, actor: str) -> list[ReviewItem]:
        """Sessions of the project waiting for `actor`'s decision, oldest first. Raises: ProjectNotFound."""
        waiting = await self._sessions.list_sessions(project_id, {SessionState.VERIFYING})
        operator_id = actor.removeprefix("operator:")
        items = []
        for session in sorted(waiting, key=lambda s: (s.updated_at, s.id)):
            async with self._uow(write=False) as uow:
                taken = await uow.decisions.for_verification(session.id, session.version)
            if any(d.operator_id == operator_id for d in taken):
                continue
            items.append(await self._item(session, actor, sorted(d.operator_id for d in taken)))
        return items

    async def _item(self, session: Session, actor: str, approvals: list[str]) -> ReviewItem:
        review, review_error = None, None
        try:
            review = await self._workspaces.review(session.id)
        except TaskgateError as exc:  # no worktree, branch gone: show the session anyway, with why
            review_error = str(exc)
        check, check_error = None, None
        try:
            check = await self._sessions.check(session.id, "approve", actor=actor, run_tests=False)
        except TaskgateError as exc:
            check_error = str(exc)
        return ReviewItem(session, review, review_error, check, check_error, approvals)
