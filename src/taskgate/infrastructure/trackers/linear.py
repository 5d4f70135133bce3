"""`LinearTracker`: the tracker port over Linear's GraphQL API, one team, through plain httpx.

The ready rule. An issue is taskgate's candidate when it belongs to the team (`team.key == team`), is in one of the
workflow states named by `states`, carries `label` when one is set, and is not archived. A candidate is ready when:

- no `blocks` relation holds it: Linear stores "A blocks B" as an IssueRelation {issue: A, relatedIssue: B, type:
  blocks}, which B sees among its `inverseRelations` (the schema has no blocked-by field on Issue; only the filter
  `hasBlockedByRelations`); a blocker whose state type is completed or canceled no longer holds it;
- it has no open sub-issue (a child whose state type is neither completed nor canceled);
- it is assigned to nobody, or to the configured assignee (default: the API key's own user, `viewer`).

`list()` returns every candidate with `hold` saying why it is not ready ("blocked by ENG-7 (In Progress)", "has 2 open
sub-issues", "assigned to bob@acme.dev"); `ready()` the others, by priority then identifier. Linear's priority
(1 urgent, 2 high, 3 medium, 4 low, 0 none) becomes taskgate's 0..3, and none becomes 4.

Issue ids are Linear's identifiers (`ENG-123`); the UUIDs Linear's mutations take are remembered from the last read
(or looked up with `issue(id: "ENG-123")`, which Linear answers for an identifier as well as a UUID).

Claims: Linear has no compare-and-swap. `claim` reads the issue, refuses it when it is done or someone else's, sets
the assignee and the in-progress state, then reads it again: a claimer that wrote before our re-read is caught
("claimed concurrently by …"), but two writers racing within one round trip can both believe they won. taskgate's
own nodes never race (one poller per cluster, a session per task); another tool assigning the same issue can.

Requests: POST `{query, variables}` with `Authorization: <key>` (personal API keys are sent as they are, without
"Bearer"). Every request is counted in `calls` (pages and retries included). A rate limit (HTTP 429, or a GraphQL
error with `extensions.code == "RATELIMITED"`) waits for Retry-After or Linear's `X-RateLimit-Requests-Reset` (epoch
milliseconds) and retries, three times; a 5xx or a dropped connection is retried after 1, 4 and 9 s. Then a
`TrackerError` says what was being done and what Linear said. An authentication error names the key's environment
variable, never the key. Linear sends no ETags, so nothing is ever answered 304: `not_modified` stays 0.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from taskgate.application.trackers.ports import TrackerIssue
from taskgate.domain.entities import Project, TaskStatus
from taskgate.domain.errors import ClaimRefused, InvalidInput, TaskNotFound, TrackerError
from taskgate.infrastructure.trackers import linear_documents as docs

DEFAULT_STATUS_MAP: Mapping[str, str] = {
    "in_progress": "In Progress",
    "pending_review": "In Review",
    "completed": "Done",
    "open": "Todo",
}
DONE_TYPES = frozenset({"completed", "canceled"})  # workflow state types that no longer hold anything
_PRIORITY = {1: 0, 2: 1, 3: 2, 4: 3, 0: 4}  # Linear's priority → taskgate's
_IDENTIFIER = re.compile(r"^([A-Za-z0-9_]+)-(\d+)$")
_RATE_TRIES = 3
_MESSAGE_MAX = 300


class _EntityNotFound(TrackerError):
    """Linear said the entity asked for does not exist."""


class LinearTracker:
    """One Linear team at `api_url` (https://api.linear.app/graphql, or a stand-in). See the module's docstring."""

    name = "linear"
    retry_delays_s: tuple[float, ...] = (1.0, 4.0, 9.0)  # after a 5xx or a dropped connection
    max_rate_wait_s = 60.0  # the longest a rate limit is waited out before each retry

    def __init__(
        self,
        api_url: str,
        team: str,
        token: str,
        token_env: str,
        *,
        states: Sequence[str] = ("Todo",),
        label: str | None = None,
        assignee: str | None = None,
        status_map: Mapping[str, str] = DEFAULT_STATUS_MAP,
        write_back: bool = True,
        timeout_s: float = 30.0,
    ) -> None:
        if not team:
            raise InvalidInput("tracker.linear.team must be the team's key, e.g. ENG")
        if not states or not all(isinstance(s, str) and s for s in states):
            raise InvalidInput('tracker.linear.states must name workflow states, e.g. ["Todo"]')
        unknown = sorted(set(status_map) - {s.value for s in TaskStatus})
        if unknown:
            raise InvalidInput(f"tracker.linear.status_map: unknown task status {', '.join(unknown)}")
        if timeout_s <= 0:
            raise InvalidInput("tracker.linear.timeout_s must be positive")
        self.api_url, self.team, self._token_env = api_url, team, token_env
        self._states, self._label, self._assignee = tuple(states), label, assignee
        self._status_map = dict(status_map)
        self.writes_back = write_back
        self.calls = 0
        self.not_modified = 0  # Linear sends no ETags: nothing is ever answered 304
        self._headers = {"Authorization": token, "User-Agent": "taskgate"}
        self._timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._me: str | None = None
        self._team_states: dict[str, tuple[str, str]] | None = None  # name → (id, type)
        self._uuids: dict[str, str] = {}  # identifier → Linear's UUID, from the last reads

    def describe(self) -> str:
        label = f", label {self._label}" if self._label else ""
        return f"linear team {self.team}, states {', '.join(self._states)}{label}"

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _http(self) -> httpx.AsyncClient:
        """The HTTP client of the running event loop (a client's connections belong to the loop that opened them; a
        CLI that runs one loop per command gets a new client for each)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = httpx.AsyncClient(timeout=self._timeout_s, headers=self._headers)
            self._client_loop = loop
        return self._client

    # -- TrackerProvider ---------------------------------------------------------------------------------------

    async def ready(self, project: Project) -> list[TrackerIssue]:
        """The candidates nothing holds, by priority then identifier."""
        issues = [i for i in await self.list(project) if i.hold is None]
        return sorted(issues, key=lambda i: (i.priority, _order(i.id)))

    async def list(self, project: Project) -> list[TrackerIssue]:
        """Every candidate (team, state, label, not archived), `hold` filled with why it is not ready; by priority then
        identifier, as GitHub's (the poll reports the ready ones in this order)."""
        me = await self._assignee_id()
        nodes = await self._candidates()
        return sorted((self._issue(n, me) for n in nodes), key=lambda i: (i.priority, _order(i.id)))

    async def show(self, project: Project, issue_id: str) -> TrackerIssue:
        """One issue of the team, whatever its state. Raises: TaskNotFound, TrackerError."""
        node = await self._node(issue_id)
        return self._issue(node, await self._assignee_id())

    async def claim(self, project: Project, issue_id: str, actor: str) -> None:
        """Assign the issue to us and move it to the in-progress state, then re-read it to check we hold it.

        `actor` is not written: Linear records the API key's user as the author of the change, and the assignee is
        the configured one. Raises: ClaimRefused (done, someone else's, or taken between our write and our re-read),
        TaskNotFound, TrackerError."""
        node = await self._node(issue_id)
        state = node["state"]
        if state["type"] in DONE_TYPES:
            raise ClaimRefused(issue_id, f"it is {state['name']} ({state['type']}) in Linear")
        me = await self._assignee_id()
        if node["assignee"] and node["assignee"]["id"] != me:
            raise ClaimRefused(issue_id, f"assigned to {_who(node['assignee'])}")
        change: dict[str, Any] = {"assigneeId": me}
        target = self._status_map.get(TaskStatus.IN_PROGRESS.value)
        if target is not None:
            change["stateId"] = await self._state_id(target)
        await self._update(f"claim {issue_id}", node["id"], change)
        again = await self._node(issue_id, fresh=True)
        if not again["assignee"] or again["assignee"]["id"] != me:
            taker = _who(again["assignee"]) if again["assignee"] else "nobody (unassigned meanwhile)"
            raise ClaimRefused(issue_id, f"claimed concurrently by {taker}")

    async def set_status(self, project: Project, issue_id: str, status: TaskStatus, reason: str = "") -> None:
        """Comment `reason` (when given) and move the issue to the state `status_map` names for `status`; `open`
        also unassigns it, unless it is someone else's (then only the comment). Statuses the map leaves out write only
        the comment; a no-op when write-back is off.

        Raises: TaskNotFound, TrackerError (an unknown state name lists the team's states), InvalidInput."""
        if not _IDENTIFIER.match(issue_id):
            raise InvalidInput(f"{issue_id!r} is not a Linear issue identifier (like {self.team}-123)")
        task_status = TaskStatus(status)
        if not self.writes_back:
            return
        uuid = await self._uuid(issue_id)
        if reason:
            data = await self._post(
                f"comment on {issue_id}", docs.COMMENT_CREATE, {"input": {"issueId": uuid, "body": reason}}
            )
            if not (data.get("commentCreate") or {}).get("success"):
                raise TrackerError(f"comment on {issue_id}: Linear did not report success")
        target = self._status_map.get(task_status.value)
        if target is None:
            return
        change: dict[str, Any] = {"stateId": await self._state_id(target)}
        if task_status == TaskStatus.OPEN:
            node = await self._node(issue_id, fresh=True)
            if node["assignee"] and node["assignee"]["id"] != await self._assignee_id():
                return  # someone else's (a claim lost to them): their assignee and state stand
            change["assigneeId"] = None  # back in the pool: release our claim
        await self._update(f"move {issue_id} to {target}", uuid, change)

    # -- reading -----------------------------------------------------------------------------------------------

    async def _candidates(self) -> list[dict[str, Any]]:
        issue_filter: dict[str, Any] = {
            "team": {"key": {"eq": self.team}},
            "state": {"name": {"in": list(self._states)}},
        }
        if self._label:
            issue_filter["labels"] = {"some": {"name": {"eq": self._label}}}
        nodes: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            what = f"list the issues of team {self.team}" + (
                f" (after page {len(nodes) // docs.PAGE})" if after else ""
            )
            data = await self._post(what, docs.ISSUES, {"filter": issue_filter, "after": after})
            page = data["issues"]
            nodes += page["nodes"]
            if not page["pageInfo"]["hasNextPage"] or not page["pageInfo"]["endCursor"]:
                break
            after = page["pageInfo"]["endCursor"]
        self._uuids.update((n["identifier"], n["id"]) for n in nodes)
        return [n for n in nodes if not n.get("archivedAt")]

    async def _node(self, issue_id: str, *, fresh: bool = False) -> dict[str, Any]:
        """The issue by identifier, if it is the team's. Raises: TaskNotFound."""
        if not _IDENTIFIER.match(issue_id):
            raise TaskNotFound(issue_id)
        try:
            data = await self._post(f"read {issue_id}", docs.ISSUE, {"id": issue_id})
        except _EntityNotFound:
            raise TaskNotFound(issue_id) from None
        node = data.get("issue")
        if not node or node["team"]["key"] != self.team:
            raise TaskNotFound(issue_id)
        self._uuids[node["identifier"]] = node["id"]
        return node

    async def _uuid(self, issue_id: str) -> str:
        if issue_id not in self._uuids:
            await self._node(issue_id)
        return self._uuids[issue_id]

    async def _assignee_id(self) -> str:
        """The user taskgate's issues are assigned to: `assignee` (an id, or an e-mail looked up once), else the API
        key's own user."""
        if self._me is None:
            if self._assignee is None:
                self._me = str((await self._post("read the API key's user", docs.VIEWER, {}))["viewer"]["id"])
            elif "@" in self._assignee:
                data = await self._post(f"find user {self._assignee}", docs.USER_BY_EMAIL, {"email": self._assignee})
                users = data["users"]["nodes"]
                if len(users) != 1:
                    raise TrackerError(
                        f"tracker.linear.assignee: Linear has no single user with e-mail {self._assignee}"
                    )
                self._me = str(users[0]["id"])
            else:
                self._me = self._assignee
        return self._me

    async def _state_id(self, name: str) -> str:
        """The id of the team's workflow state `name` (the team's states are read once)."""
        if self._team_states is None:
            data = await self._post(
                f"read the workflow states of team {self.team}", docs.TEAM_STATES, {"team": self.team}
            )
            teams = [t for t in data["teams"]["nodes"] if t["key"] == self.team]
            if not teams:
                raise TrackerError(
                    f"Linear has no team {self.team}, or the API key in ${self._token_env} cannot see it"
                )
            self._team_states = {s["name"]: (s["id"], s["type"]) for s in teams[0]["states"]["nodes"]}
        if name not in self._team_states:
            known = ", ".join(sorted(self._team_states))
            raise TrackerError(
                f"team {self.team} has no workflow state {name!r} (tracker.linear.status_map); its states: {known}"
            )
        return self._team_states[name][0]

    async def _update(self, what: str, uuid: str, change: dict[str, Any]) -> None:
        data = await self._post(what, docs.ISSUE_UPDATE, {"id": uuid, "input": change})
        if not (data.get("issueUpdate") or {}).get("success"):
            raise TrackerError(f"{what}: Linear did not report success")

    def _issue(self, node: dict[str, Any], me: str) -> TrackerIssue:
        state = node["state"]
        holds: list[str] = []
        if node["team"]["key"] != self.team:
            holds.append(f"of team {node['team']['key']}, not {self.team}")
        if state["name"] not in self._states:
            holds.append(f"in state {state['name']}, not {' or '.join(self._states)}")
        labels = tuple(str(label["name"]) for label in node["labels"]["nodes"])
        if self._label and self._label not in labels:
            holds.append(f"without label {self._label}")
        if node.get("archivedAt"):
            holds.append("archived")
        blocks = [r["issue"] for r in node["inverseRelations"]["nodes"] if r["type"] == "blocks"]
        blocking = [b for b in blocks if b["state"]["type"] not in DONE_TYPES]
        if blocking:
            holds.append("blocked by " + ", ".join(f"{b['identifier']} ({b['state']['name']})" for b in blocking))
        elif node["inverseRelations"]["pageInfo"]["hasNextPage"]:
            holds.append(f"has more than {docs.NESTED} inverse relations (not all read)")
        open_children = [c for c in node["children"]["nodes"] if c["state"]["type"] not in DONE_TYPES]
        if node["children"]["pageInfo"]["hasNextPage"]:
            holds.append(f"has more than {docs.NESTED} sub-issues (not all read)")
        elif open_children:
            n = len(open_children)
            holds.append(f"has {n} open sub-issue{'s' if n != 1 else ''}")
        assignee = node["assignee"]
        if assignee and assignee["id"] != me:
            holds.append(f"assigned to {_who(assignee)}")
        closed = state["type"] in DONE_TYPES
        lost = [f"{state['name']} in Linear"] if closed else []
        lost += [h for h in holds if h.startswith(("of team", "without label", "archived", "assigned to"))]
        return TrackerIssue(
            id=node["identifier"], title=node["title"], description=node.get("description") or "",
            status=state["name"], priority=_PRIORITY.get(int(node["priority"]), 4), labels=labels,
            dependencies=tuple((b["identifier"], "blocks") for b in blocks),
            assignees=(str(assignee["id"]),) if assignee else (), url=node.get("url"),
            hold="; ".join(holds) or None, closed=closed, lost="; ".join(lost) or None,
        )  # fmt: skip

    # -- the transport -----------------------------------------------------------------------------------------

    async def _post(self, what: str, document: str, variables: dict[str, Any]) -> dict[str, Any]:
        """POST the document; its `data`. Retries rate limits and server errors. Raises: TrackerError."""
        rate_tries = server_tries = 0
        while True:
            self.calls += 1
            try:
                resp = await self._http().post(self.api_url, json={"query": document, "variables": variables})
            except httpx.HTTPError as exc:
                if server_tries < len(self.retry_delays_s):
                    await asyncio.sleep(self.retry_delays_s[server_tries])
                    server_tries += 1
                    continue
                raise TrackerError(f"{what}: Linear at {self.api_url} did not answer ({type(exc).__name__}; "
                                   f"retried {server_tries} times)") from None  # fmt: skip
            body = _json(resp)
            errors = body.get("errors") if isinstance(body, dict) else None
            first = errors[0] if isinstance(errors, list) and errors and isinstance(errors[0], dict) else {}
            code = (first.get("extensions") or {}).get("code")
            said = _said(first, resp)
            if resp.status_code == 429 or code == "RATELIMITED":
                if rate_tries < _RATE_TRIES:
                    await asyncio.sleep(self._rate_wait(resp))
                    rate_tries += 1
                    continue
                raise TrackerError(f"{what}: Linear's rate limit for the API key in ${self._token_env} is spent "
                                   f"(waited and retried {rate_tries} times; try later): {said}")  # fmt: skip
            if resp.status_code == 401 or code == "AUTHENTICATION_ERROR":
                raise TrackerError(f"{what}: Linear refused the API key in ${self._token_env} ({resp.status_code} "
                                   f"{said}); check that the variable holds a valid personal API key")  # fmt: skip
            if resp.status_code >= 500:
                if server_tries < len(self.retry_delays_s):
                    await asyncio.sleep(self.retry_delays_s[server_tries])
                    server_tries += 1
                    continue
                raise TrackerError(f"{what}: Linear at {self.api_url} answered {resp.status_code} {said} "
                                   f"(retried {server_tries} times)")  # fmt: skip
            if first:
                if "not found" in str(first.get("message", "")).lower():
                    raise _EntityNotFound(f"{what}: {said}")
                raise TrackerError(f"{what}: Linear answered {resp.status_code}: {said}")
            if resp.status_code != 200 or not isinstance(body, dict) or not isinstance(body.get("data"), dict):
                raise TrackerError(f"{what}: Linear answered {resp.status_code} without data: {said}")
            return body["data"]

    def _rate_wait(self, resp: httpx.Response) -> float:
        """Seconds until Linear lets us in again: Retry-After, else the requests' reset (epoch ms), else 1 s."""
        wait = 1.0
        retry_after = resp.headers.get("retry-after")
        reset = resp.headers.get("x-ratelimit-requests-reset")
        try:
            if retry_after is not None:
                wait = float(retry_after)
            elif reset is not None:
                at = float(reset)
                wait = (at / 1000 if at > 1e11 else at) - time.time()  # epoch ms as Linear sends it; seconds tolerated
        except ValueError:
            pass
        return min(max(wait, 0.0), self.max_rate_wait_s)


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def _said(error: dict[str, Any], resp: httpx.Response) -> str:
    """Linear's words: the user-presentable message when there is one, else the error's, else the body's start."""
    extensions = error.get("extensions") or {}
    message = extensions.get("userPresentableMessage") or error.get("message")
    if not message:
        message = resp.text[:_MESSAGE_MAX] if resp.content else resp.reason_phrase
    return str(message)[:_MESSAGE_MAX]


def _who(user: dict[str, Any]) -> str:
    return str(user.get("email") or user.get("name") or user["id"])


def _order(identifier: str) -> tuple[str, int]:
    m = _IDENTIFIER.match(identifier)
    return (m.group(1), int(m.group(2))) if m else (identifier, 0)
