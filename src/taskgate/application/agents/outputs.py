"""Use cases of the session folder: agents save outputs into it, the supervisor keeps its manifest current.

`save_output` writes one file (confined to the session's folder, see `domain/outputs.py` and the adapter),
lists it in `manifest.json`, then appends an `output.saved` event. The file is written before the event: a
write that fails leaves no event behind, and an event always names a file that was written.
"""

from __future__ import annotations

import base64
import binascii
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from taskgate import __version__
from taskgate.application.agents.ports import SessionFolders
from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.application.sessions.affinity import fence, held_here
from taskgate.application.sessions.effects import NOTHING, Aftermath, NoEffects
from taskgate.domain.entities import Session
from taskgate.domain.errors import InvalidInput, TaskgateError
from taskgate.domain.outputs import (
    OutputRecord,
    iso,
    new_manifest,
    output_path,
    with_agents,
    with_execution,
    with_header,
    with_inputs,
)
from taskgate.domain.states import TERMINAL_STATES

if TYPE_CHECKING:
    from taskgate.application.sessions.commands import FireResult, FireTrigger

Encoding = Literal["text", "base64"]
OUTPUT_SAVED_EVENT = "output.saved"


@dataclass(frozen=True, slots=True)
class SaveOutput:
    """Save `content` as `path` in the session's folder. `encoding`: text (written as UTF-8) or base64."""

    session_id: str
    path: str
    content: str
    encoding: Encoding = "text"
    actor: str = "system"


class OutputService:
    """The session folders' use cases."""

    def __init__(self, uow: UnitOfWorkFactory, folders: SessionFolders, clock: Clock) -> None:
        self._uow, self._folders, self._clock = uow, folders, clock
        self._node_id: str | None = None

    def on_node(self, node_id: str | None) -> None:
        """Write outputs only for sessions `node_id` holds (application/sessions/affinity.py): the composition root's
        node."""
        self._node_id = node_id

    def folder(self, session_id: str) -> str:
        """The session folder's absolute path (`TASKGATE_SESSION_FOLDER`); it may not exist yet."""
        return self._folders.path(session_id)

    async def place(self, session_id: str, relative: str) -> str:
        """Put the session's folder at `relative` under the outputs root (a workflow's `session_folder`), before
        anything is written there. Raises: InvalidInput (see SessionFolders.place)."""
        return await self._folders.place(session_id, relative)

    async def open_folder(self, session_id: str) -> str:
        """Create the session's folder and its manifest (task, start time, status `open`, the description of
        `describe`) if missing; returns the folder's path. Raises: SessionNotFound; Forbidden when the folder is
        a symlink."""
        await self._folders.ensure(session_id)
        await self.describe(session_id)
        return self._folders.path(session_id)

    async def describe(
        self, session_id: str, *, workflow: dict[str, Any] | None = None, session: Session | None = None,
        create: bool = True,
    ) -> dict[str, Any] | None:  # fmt: skip
        """Bring the manifest's description up to date: `execution` (status by the session's state, its times, the
        operator), `related_sessions`, `metadata`, and `workflow` when given ({name, description}). With
        `create=False` a session without a folder is left without one (returns None). Raises: SessionNotFound."""
        if not create and (
            not self._folders.has_manifest(session_id) or await self._folders.read_manifest(session_id) is None
        ):
            return None
        current, task = await self._session(session_id)
        session = session or current
        facts = await self._facts(session)
        if workflow is not None:
            facts["workflow"] = workflow
        now = self._clock.now()
        return await self._folders.update_manifest(
            session_id, lambda m: with_execution(with_header(m, task, session.started_at), facts, now)
        )

    async def _facts(self, session: Session) -> dict[str, Any]:
        async with self._uow(write=False) as uow:
            if session.plan_id is not None:
                siblings = await uow.sessions.list(plan_id=session.plan_id)
            else:
                siblings = await uow.sessions.list(project_id=session.project_id)
        related = [{"id": s.id, "state": s.state.value, "relation": "same task",
                    "created_at": iso(s.created_at)} for s in siblings if s.task_id == session.task_id
                   and s.id != session.id]  # fmt: skip
        metadata = {"project_id": session.project_id, "plan_id": session.plan_id, "branch": session.branch_name,
                    "worktree": session.worktree_path, "state": session.state.value,
                    "taskgate_version": __version__}  # fmt: skip
        return {"state": session.state.value, "user": session.operator_id, "started_at": iso(session.started_at),
                "related_sessions": related, "metadata": metadata}  # fmt: skip

    async def save_output(self, cmd: SaveOutput) -> OutputRecord:
        """Write one file into the session's folder and list it in the manifest.

        Raises: SessionNotFound; InvalidInput for a bad path, bad base64, a finished session or a broken size
        limit; Forbidden when a symlink (or a folder moved away) would take the write out of the folder.
        """
        path = output_path(cmd.path)
        data = self._decode(cmd.content, cmd.encoding, path)
        session, task = await self._session(cmd.session_id)
        if session.state in TERMINAL_STATES:
            raise InvalidInput(f"session {session.id} is {session.state.value}; its folder takes no more outputs")
        what = f"the output {path}"
        if not held_here(session, self._node_id):  # before the file: a node that lost the session writes nothing
            async with self._uow(write=False) as uow:
                await fence(uow, session.id, self._node_id, what)
        at = self._clock.now()
        record = await self._folders.write_output(session.id, path, data, at=at, by=cmd.actor, task=task)
        async with self._uow(write=True) as uow:
            # fenced again with the event: an adoption in between leaves a file no event names, never the reverse
            await fence(uow, session.id, self._node_id, f"the output.saved event of {path}")
            payload = {"path": record.path, "bytes": record.bytes, "sha256": record.sha256, "actor": cmd.actor}
            await uow.events.append(OUTPUT_SAVED_EVENT, at, payload, session.id)
            await uow.commit()
        return record

    async def manifest(self, session_id: str) -> dict[str, Any]:
        """The session's manifest (an unsaved empty one when the folder has none yet). Raises: SessionNotFound."""
        session, task = await self._session(session_id)
        found = await self._folders.read_manifest(session_id)
        return found if found is not None else with_header(new_manifest(session_id), task, session.started_at)

    async def record_agents(
        self,
        session_id: str,
        agents: list[dict[str, Any]],
        *,
        status: str | None = None,
        started_at: datetime | None = None,
        completed_at: datetime | None = None,
    ) -> dict[str, Any]:
        """Merge `agents` into the manifest (an agent dict whose `id`, else `name`, is listed updates that entry;
        others are appended) and set the folder's status and times where given. Values must be plain JSON data
        (datetimes as ISO text). Returns the new manifest. Raises: SessionNotFound; InvalidInput for non-JSON."""
        session, task = await self._session(session_id)
        now = self._clock.now()

        def mutate(manifest: dict[str, Any]) -> dict[str, Any]:
            manifest = with_header(manifest, task, session.started_at)
            return with_agents(manifest, agents, now, status=status, started_at=started_at, completed_at=completed_at)

        return await self._folders.update_manifest(session_id, mutate)

    async def record_inputs(self, session_id: str, inputs: dict[str, Any]) -> dict[str, Any]:
        """Merge `inputs` (what the agents were given: prompt, instructions, workflow step, ...) into the manifest.
        Returns the new manifest. Raises: SessionNotFound; InvalidInput for non-JSON values."""
        session, task = await self._session(session_id)
        now = self._clock.now()
        return await self._folders.update_manifest(
            session_id, lambda m: with_inputs(with_header(m, task, session.started_at), inputs, now)
        )

    async def _session(self, session_id: str) -> tuple[Session, dict[str, Any]]:
        async with self._uow(write=False) as uow:
            session = await uow.sessions.get(session_id)
            task = await uow.tasks.get(session.task_id, with_blockers=False)
        return session, {"id": task.id, "title": task.title, "project_id": task.project_id, "plan_id": task.plan_id}

    def _decode(self, content: str, encoding: str, path: str) -> bytes:
        limit = self._folders.limits.max_output_bytes
        too_big = InvalidInput(f"output {path!r} is larger than the limit of {limit} bytes per output")
        if encoding == "text":
            if len(content) > limit:
                raise too_big
            try:
                data = content.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidInput("the content is not valid Unicode text (a lone surrogate); use base64") from None
        elif encoding == "base64":
            packed = "".join(content.split())
            if len(packed) > 4 * (limit // 3 + 1):
                raise too_big
            try:
                data = base64.b64decode(packed, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidInput("the content is not valid base64") from None
        else:
            raise InvalidInput(f"encoding {encoding!r} is unknown; use 'text' or 'base64'")
        if len(data) > limit:
            raise too_big
        return data


class ManifestEffect(NoEffects):
    """A session effect: after every transition, the manifest's `execution` (and metadata) follows the session's
    state, for sessions that have a folder (nothing is created for the others). A manifest that cannot be written
    never fails the transition, which is committed already."""

    def __init__(self, outputs: OutputService) -> None:
        self._outputs = outputs

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        with suppress(TaskgateError):
            await self._outputs.describe(result.session.id, session=result.session, create=False)
        return NOTHING
