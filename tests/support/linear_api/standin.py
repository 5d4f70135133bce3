"""LinearStandIn: Linear's GraphQL endpoint, executed by graphql-core against the schema converted from @linear/sdk.

A request that does not parse or validate against tests/support/linear_api/schema.graphql is refused with GraphQL errors
(HTTP 400), as Linear refuses it; one that validates is executed over an in-memory workspace, so every answer has the
shape the document asks for. What the stand-in does not implement (a field, an argument, a filter field, a mutation
input field) is an error naming it, never silently ignored.

    with LinearStandIn(key="lin_api_test") as linear:
        linear.add_issue("ENG", "Fix the login", priority=2, labels=["taskgate"])
        tracker = LinearTracker(linear.url, "ENG", "lin_api_test", "LINEAR_API_KEY")
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import graphql
from graphql import GraphQLError, GraphQLResolveInfo

from tests.support.github_api.server import HttpServer, Reply, Request

SCHEMA_PATH = Path(__file__).with_name("schema.graphql")
DEFAULT_STATES = (
    ("Backlog", "backlog"),
    ("Todo", "unstarted"),
    ("In Progress", "started"),
    ("In Review", "started"),
    ("Done", "completed"),
    ("Canceled", "canceled"),
)
_NOW = "2026-01-01T00:00:00.000Z"


def _id() -> str:
    return str(uuid.uuid4())


@dataclass(eq=False)
class Team:
    key: str
    name: str
    id: str = field(default_factory=_id)
    states: list[State] = field(default_factory=list)
    next_number: int = 1


@dataclass(eq=False)
class State:
    name: str
    type: str
    position: float
    team: Team
    id: str = field(default_factory=_id)
    color: str = "#bbbbbb"
    description: str | None = None
    archivedAt: str | None = None
    createdAt: str = _NOW
    updatedAt: str = _NOW


@dataclass(eq=False)
class User:
    name: str
    email: str
    id: str = field(default_factory=_id)
    active: bool = True

    @property
    def displayName(self) -> str:
        return self.name.split()[0].lower()


@dataclass(eq=False)
class Label:
    name: str
    id: str = field(default_factory=_id)


@dataclass(eq=False)
class Issue:
    team: Team
    number: int
    title: str
    description: str
    state: State
    priority: float
    assignee: User | None = None
    labels: list[Label] = field(default_factory=list)
    parent: Issue | None = None
    archivedAt: str | None = None
    id: str = field(default_factory=_id)
    comments: list[Comment] = field(default_factory=list)
    createdAt: str = _NOW
    updatedAt: str = _NOW

    @property
    def identifier(self) -> str:
        return f"{self.team.key}-{self.number}"

    @property
    def url(self) -> str:
        return f"https://linear.app/standin/issue/{self.identifier}"


@dataclass(eq=False)
class Relation:
    type: str
    issue: Issue
    relatedIssue: Issue
    id: str = field(default_factory=_id)


@dataclass(eq=False)
class Comment:
    body: str
    issue: Issue
    user: User
    id: str = field(default_factory=_id)
    createdAt: str = _NOW


class _Stop(Exception):
    pass


class LinearStandIn:
    """A Linear workspace on 127.0.0.1 (POST /graphql). Default: team ENG with Linear's default workflow states and
    the API key's user `taskgate-bot` (the viewer). Thread-safe: the server runs in a background thread."""

    def __init__(self, key: str = "lin_api_test") -> None:
        self.key = key
        self.schema = graphql.build_schema(SCHEMA_PATH.read_text())
        self._install_resolvers()
        self._lock = threading.RLock()
        self.teams: dict[str, Team] = {}
        self.users: dict[str, User] = {}
        self.issues: list[Issue] = []
        self.relations: list[Relation] = []
        self.labels: dict[str, Label] = {}
        self.requests = 0
        self.operations: list[str] = []  # the operation name of each executed request
        self._fail: list[int] = []
        self._rate_limited: list[int] = []
        self._races: dict[str, str] = {}
        self.viewer_id = self.add_user("taskgate-bot", "taskgate-bot@example.com")
        self.add_team("ENG", "Engineering")
        self._server = HttpServer(self._handle)

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def __enter__(self) -> LinearStandIn:
        self._server.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.stop()

    @property
    def url(self) -> str:
        return f"{self._server.url}/graphql"

    # -- controls ----------------------------------------------------------------------------------------------

    def add_team(self, key: str, name: str) -> str:
        with self._lock:
            team = Team(key, name)
            team.states = [State(n, t, float(i), team) for i, (n, t) in enumerate(DEFAULT_STATES)]
            self.teams[key] = team
            return team.id

    def add_user(self, name: str, email: str) -> str:
        with self._lock:
            user = User(name, email)
            self.users[user.id] = user
            return user.id

    def add_issue(
        self,
        team: str,
        title: str,
        description: str = "",
        state: str = "Todo",
        priority: int = 0,
        labels: Iterable[str] = (),
        assignee: str | None = None,
        parent: str | None = None,
    ) -> str:
        with self._lock:
            t = self.teams[team]
            issue = Issue(t, t.next_number, title, description, self._state(t, state), float(priority))
            t.next_number += 1
            issue.labels = [self._label(n) for n in labels]
            issue.assignee = self.users[assignee] if assignee else None
            issue.parent = self._issue(parent) if parent else None
            self.issues.append(issue)
            return issue.identifier

    def block(self, blocker: str, blocked: str) -> None:
        """`blocker` blocks `blocked`: Linear's IssueRelation {issue: blocker, relatedIssue: blocked, type: blocks}."""
        with self._lock:
            self.relations.append(Relation("blocks", self._issue(blocker), self._issue(blocked)))

    def relate(self, one: str, other: str, kind: str = "related") -> None:
        with self._lock:
            self.relations.append(Relation(kind, self._issue(one), self._issue(other)))

    def set_state(self, identifier: str, state: str) -> None:
        with self._lock:
            issue = self._issue(identifier)
            issue.state = self._state(issue.team, state)

    def assign(self, identifier: str, user_id: str | None) -> None:
        with self._lock:
            self._issue(identifier).assignee = self.users[user_id] if user_id else None

    def set_labels(self, identifier: str, labels: Iterable[str]) -> None:
        with self._lock:
            self._issue(identifier).labels = [self._label(n) for n in labels]

    def edit(self, identifier: str, *, title: str | None = None, description: str | None = None) -> None:
        with self._lock:
            issue = self._issue(identifier)
            issue.title = issue.title if title is None else title
            issue.description = issue.description if description is None else description

    def archive(self, identifier: str) -> None:
        with self._lock:
            self._issue(identifier).archivedAt = _NOW

    def issue(self, identifier: str) -> dict[str, Any]:
        """What Linear holds of the issue: state, state_type, assignee (a user id or None), labels, comments."""
        with self._lock:
            i = self._issue(identifier)
            return {
                "id": i.id, "identifier": i.identifier, "title": i.title, "description": i.description,
                "state": i.state.name, "state_type": i.state.type, "assignee": i.assignee.id if i.assignee else None,
                "labels": [label.name for label in i.labels], "comments": [c.body for c in i.comments],
                "priority": int(i.priority), "archived": i.archivedAt is not None,
            }  # fmt: skip

    def race_next_claim(self, identifier: str, user_id: str) -> None:
        """The next issueUpdate that assigns `identifier` is overtaken: right after it, `user_id` is the assignee (as
        if another client wrote between taskgate's write and its re-read)."""
        with self._lock:
            self._races[identifier] = user_id

    def fail_next(self, n: int, status: int = 500) -> None:
        """The next `n` requests are answered `status` (before authentication and execution)."""
        with self._lock:
            self._fail += [status] * n

    def rate_limit_next(self, n: int, status: int = 400) -> None:
        """The next `n` requests are refused as Linear refuses a spent rate limit: a RATELIMITED GraphQL error (HTTP 400
        as Linear sends it, or 429) with its X-RateLimit-Requests-* headers, the reset 50 ms away."""
        with self._lock:
            self._rate_limited += [status] * n

    # -- HTTP --------------------------------------------------------------------------------------------------

    def _handle(self, request: Request) -> Reply:
        with self._lock:
            self.requests += 1
            if request.method != "POST" or request.path != "/graphql":
                return Reply(404, {"errors": [{"message": f"Cannot {request.method} {request.path}"}]})
            if self._fail:
                status = self._fail.pop(0)
                return Reply(status, "<html><body>upstream error</body></html>", content_type="text/html")
            if self._rate_limited:
                return self._rate_limit_reply(self._rate_limited.pop(0))
            if request.headers.get("authorization") != self.key:
                return Reply(400, {"errors": [_error(
                    "Authentication required, not authenticated", "AUTHENTICATION_ERROR", "authentication error",
                    "You need to authenticate to access this operation.", statusCode=401,
                )]})  # fmt: skip
            try:
                body = json.loads(request.body or b"{}")
                query, variables = body["query"], body.get("variables") or {}
                document = graphql.parse(query)
            except (ValueError, KeyError, TypeError):
                return Reply(400, {"errors": [_error("POST body must be JSON {query, variables}", "BAD_REQUEST")]})
            except GraphQLError as exc:
                return Reply(400, {"errors": [_formatted(exc, "GRAPHQL_PARSE_FAILED")]})
            errors = graphql.validate(self.schema, document)
            if errors:
                return Reply(400, {"errors": [_formatted(e, "GRAPHQL_VALIDATION_FAILED") for e in errors]})
            self.operations.append(body.get("operationName") or _operation_name(document))
            result = graphql.execute(
                self.schema, document, variable_values=variables, operation_name=body.get("operationName"),
                field_resolver=_default_resolver,
            )  # fmt: skip
            assert isinstance(result, graphql.ExecutionResult)
            out: dict[str, Any] = {"data": result.data}
            if result.errors:
                out["errors"] = [_formatted(e, "INTERNAL_ERROR") for e in result.errors]
            return Reply(200, out, headers=self._rate_headers(remaining=1000))

    def _rate_limit_reply(self, status: int) -> Reply:
        said = "You have exceeded the rate limit. Please try again later."
        body = {"errors": [_error("Rate limit exceeded", "RATELIMITED", "ratelimited", said, statusCode=429)]}
        return Reply(status, body, headers=self._rate_headers(remaining=0))

    @staticmethod
    def _rate_headers(remaining: int) -> dict[str, str]:
        return {
            "X-RateLimit-Requests-Limit": "1500",
            "X-RateLimit-Requests-Remaining": str(remaining),
            "X-RateLimit-Requests-Reset": str(int(time.time() * 1000) + 50),
        }

    # -- the workspace -----------------------------------------------------------------------------------------

    def _issue(self, ident: str) -> Issue:
        found = next((i for i in self.issues if ident in (i.identifier, i.id)), None)
        if found is None:
            raise KeyError(ident)
        return found

    def _state(self, team: Team, name: str) -> State:
        return next(s for s in team.states if s.name == name)

    def _label(self, name: str) -> Label:
        if name not in self.labels:
            self.labels[name] = Label(name)
        return self.labels[name]

    def _install_resolvers(self) -> None:
        types = self.schema.type_map
        resolvers: dict[tuple[str, str], Callable[..., Any]] = {
            ("Query", "issues"): self._q_issues,
            ("Query", "issue"): self._q_issue,
            ("Query", "viewer"): lambda _s, _i: self.users[self.viewer_id],
            ("Query", "users"): self._q_users,
            ("Query", "teams"): self._q_teams,
            ("Query", "workflowStates"): self._q_workflow_states,
            ("Mutation", "issueUpdate"): self._m_issue_update,
            ("Mutation", "commentCreate"): self._m_comment_create,
            ("Team", "states"): lambda team, _i, **a: _connection(team.states, a, "Team.states"),
            ("Issue", "labels"): lambda issue, _i, **a: _connection(issue.labels, a, "Issue.labels"),
            ("Issue", "children"): lambda issue, _i, **a: _connection(
                [i for i in self.issues if i.parent is issue], a, "Issue.children", filters=_ISSUE_FILTER
            ),
            ("Issue", "relations"): lambda issue, _i, **a: _connection(
                [r for r in self.relations if r.issue is issue], a, "Issue.relations"
            ),
            ("Issue", "inverseRelations"): lambda issue, _i, **a: _connection(
                [r for r in self.relations if r.relatedIssue is issue], a, "Issue.inverseRelations"
            ),
            ("Issue", "comments"): lambda issue, _i, **a: _connection(issue.comments, a, "Issue.comments"),
        }
        for (type_name, field_name), resolve in resolvers.items():
            type_ = types[type_name]
            assert isinstance(type_, graphql.GraphQLObjectType)
            if field_name in type_.fields:
                type_.fields[field_name].resolve = resolve

    def _q_issues(self, _source: Any, _info: GraphQLResolveInfo, **args: Any) -> dict[str, Any]:
        issues = self.issues if args.get("includeArchived") else [i for i in self.issues if not i.archivedAt]
        return _connection(issues, args, "Query.issues", filters=_ISSUE_FILTER, allowed={"includeArchived"})

    def _q_issue(self, _source: Any, _info: GraphQLResolveInfo, id: str) -> Issue:
        try:
            return self._issue(id)
        except KeyError:
            raise _not_found("Issue") from None

    def _q_users(self, _source: Any, _info: GraphQLResolveInfo, **args: Any) -> dict[str, Any]:
        return _connection(list(self.users.values()), args, "Query.users", filters=_USER_FILTER)

    def _q_teams(self, _source: Any, _info: GraphQLResolveInfo, **args: Any) -> dict[str, Any]:
        return _connection(list(self.teams.values()), args, "Query.teams", filters=_TEAM_FILTER)

    def _q_workflow_states(self, _source: Any, _info: GraphQLResolveInfo, **args: Any) -> dict[str, Any]:
        states = [s for t in self.teams.values() for s in t.states]
        return _connection(states, args, "Query.workflowStates", filters=_STATE_FILTER)

    def _m_issue_update(self, _source: Any, _info: GraphQLResolveInfo, id: str, input: dict[str, Any]) -> Any:
        try:
            issue = self._issue(id)
        except KeyError:
            raise _not_found("Issue") from None
        _only(input, {"assigneeId", "stateId", "title", "description", "labelIds", "priority"}, "IssueUpdateInput")
        if "stateId" in input:
            state = next((s for s in issue.team.states if s.id == input["stateId"]), None)
            if state is None:
                raise _input_error("stateId", "Workflow state not found or not of the issue's team")
            issue.state = state
        if "assigneeId" in input:
            user_id = input["assigneeId"]
            if user_id is not None and user_id not in self.users:
                raise _input_error("assigneeId", "User not found")
            issue.assignee = self.users[user_id] if user_id else None
            racer = self._races.pop(issue.identifier, None)
            if racer is not None:
                issue.assignee = self.users[racer]
        for name in ("title", "description", "priority"):
            if name in input:
                setattr(issue, name, input[name])
        if "labelIds" in input:
            by_id = {label.id: label for label in self.labels.values()}
            issue.labels = [by_id[i] for i in input["labelIds"]]
        return {"success": True, "issue": issue, "lastSyncId": 1.0}

    def _m_comment_create(self, _source: Any, _info: GraphQLResolveInfo, input: dict[str, Any]) -> Any:
        _only(input, {"issueId", "body"}, "CommentCreateInput")
        try:
            issue = self._issue(input.get("issueId") or "")
        except KeyError:
            raise _not_found("Issue") from None
        comment = Comment(input.get("body") or "", issue, self.users[self.viewer_id])
        issue.comments.append(comment)
        return {"success": True, "comment": comment, "lastSyncId": 1.0}


# -- execution helpers -----------------------------------------------------------------------------------------------


def _default_resolver(source: Any, info: GraphQLResolveInfo, **args: Any) -> Any:
    name = info.field_name
    if args:
        given = sorted(k for k, v in args.items() if v is not None)
        if given:
            raise GraphQLError(f"the Linear stand-in does not implement arguments of {info.parent_type.name}.{name}")
    if isinstance(source, dict):
        if name in source:
            return source[name]
    elif hasattr(source, name):
        return getattr(source, name)
    raise GraphQLError(f"the Linear stand-in does not implement {info.parent_type.name}.{name}")


def _connection(
    items: Sequence[Any],
    args: dict[str, Any],
    where: str,
    *,
    filters: dict[str, Any] | None = None,
    allowed: set[str] = frozenset(),  # type: ignore[assignment]
) -> dict[str, Any]:
    """A Relay connection over `items` with first/after (the cursor is the node's id), filtered by `filter`."""
    unsupported = sorted(
        k for k, v in args.items() if v is not None and k not in {"first", "after", "filter", *allowed}
    )
    if unsupported:
        raise GraphQLError(f"the Linear stand-in does not implement {where}({', '.join(unsupported)}:)")
    if args.get("filter") is not None:
        if filters is None:
            raise GraphQLError(f"the Linear stand-in does not implement {where}(filter:)")
        _check(args["filter"], filters)  # every field named, even when there is nothing to filter
        items = [i for i in items if _matches(i, args["filter"], filters)]
    start = 0
    if args.get("after"):
        ids = [i.id for i in items]
        if args["after"] not in ids:
            raise GraphQLError(f"cursor {args['after']} is not in {where}")
        start = ids.index(args["after"]) + 1
    first = args.get("first") or 50  # Linear's default page size
    if first > 250:
        raise GraphQLError("first: Linear pages at most 250 nodes")
    page = list(items[start : start + first])
    return {
        "nodes": page,
        "edges": [{"node": n, "cursor": n.id} for n in page],
        "pageInfo": {
            "hasNextPage": start + first < len(items),
            "hasPreviousPage": start > 0,
            "startCursor": page[0].id if page else None,
            "endCursor": page[-1].id if page else None,
        },
    }


# Filters: field → ("cmp", getter) | ("nested", getter, spec) | ("nullable", getter, spec) | ("some", getter, spec)
_TEAM_FILTER: dict[str, Any] = {
    "key": ("cmp", lambda t: t.key), "name": ("cmp", lambda t: t.name), "id": ("cmp", lambda t: t.id),
}  # fmt: skip
_STATE_FILTER: dict[str, Any] = {
    "name": ("cmp", lambda s: s.name), "type": ("cmp", lambda s: s.type), "id": ("cmp", lambda s: s.id),
    "team": ("nested", lambda s: s.team, _TEAM_FILTER),
}  # fmt: skip
_LABEL_FILTER: dict[str, Any] = {"name": ("cmp", lambda label: label.name), "id": ("cmp", lambda label: label.id)}
_USER_FILTER: dict[str, Any] = {
    "id": ("cmp", lambda u: u.id), "email": ("cmp", lambda u: u.email), "name": ("cmp", lambda u: u.name),
}  # fmt: skip
_ISSUE_FILTER: dict[str, Any] = {
    "id": ("cmp", lambda i: i.id), "number": ("cmp", lambda i: i.number), "title": ("cmp", lambda i: i.title),
    "team": ("nested", lambda i: i.team, _TEAM_FILTER), "state": ("nested", lambda i: i.state, _STATE_FILTER),
    "labels": ("some", lambda i: i.labels, _LABEL_FILTER), "assignee": ("nullable", lambda i: i.assignee, _USER_FILTER),
}  # fmt: skip
_COMPARATORS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda v, x: v == x, "neq": lambda v, x: v != x, "in": lambda v, x: v in x, "nin": lambda v, x: v not in x,
}  # fmt: skip


def _matches(obj: Any, given: dict[str, Any], spec: dict[str, Any]) -> bool:
    for key, value in given.items():
        if value is None:
            continue
        if key == "and":
            ok = all(_matches(obj, f, spec) for f in value)
        elif key == "or":
            ok = any(_matches(obj, f, spec) for f in value)
        elif key not in spec:
            raise GraphQLError(f"the Linear stand-in does not implement the filter field {key!r}")
        else:
            kind, getter, *rest = spec[key]
            target = getter(obj)
            if kind == "cmp":
                ok = _compare(target, value)
            elif kind == "nested":
                ok = _matches(target, value, rest[0])
            elif kind == "nullable":
                null = value.get("null")
                others = {k: v for k, v in value.items() if k != "null"}
                ok = (null is None or (target is None) == null) and (
                    not any(v is not None for v in others.values())
                    or (target is not None and _matches(target, others, rest[0]))
                )
            else:  # a collection: some / every
                _only(value, {"some", "every"}, "collection filter")
                ok = True
                if value.get("some") is not None:
                    ok = any(_matches(x, value["some"], rest[0]) for x in target)
                if value.get("every") is not None:
                    ok = ok and all(_matches(x, value["every"], rest[0]) for x in target)
        if not ok:
            return False
    return True


def _check(given: dict[str, Any], spec: dict[str, Any]) -> None:
    """Refuse a filter that names anything the stand-in does not implement."""
    for key, value in given.items():
        if value is None:
            continue
        if key in ("and", "or"):
            for sub in value:
                _check(sub, spec)
        elif key not in spec:
            raise GraphQLError(f"the Linear stand-in does not implement the filter field {key!r}")
        elif spec[key][0] == "cmp":
            _only(value, set(_COMPARATORS), "comparator")
        elif spec[key][0] == "some":
            _only(value, {"some", "every"}, "collection filter")
            for sub in (value.get("some"), value.get("every")):
                if sub is not None:
                    _check(sub, spec[key][2])
        else:
            _check({k: v for k, v in value.items() if not (spec[key][0] == "nullable" and k == "null")}, spec[key][2])


def _compare(value: Any, comparator: dict[str, Any]) -> bool:
    ok = True
    for op, operand in comparator.items():
        if operand is None:
            continue
        if op not in _COMPARATORS:
            raise GraphQLError(f"the Linear stand-in does not implement the comparator {op!r}")
        ok = ok and _COMPARATORS[op](value, operand)
    return ok


def _only(given: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(k for k, v in given.items() if k not in known and v is not None)
    if unknown:
        raise GraphQLError(f"the Linear stand-in does not implement {where} field(s) {', '.join(unknown)}")


def _error(message: str, code: str, kind: str = "graphql error", presentable: str | None = None, **more: Any) -> dict:
    extensions: dict[str, Any] = {"type": kind, "code": code, **more}
    if presentable:
        extensions["userPresentableMessage"] = presentable
    return {"message": message, "extensions": extensions}


def _not_found(entity: str) -> GraphQLError:
    return GraphQLError(
        f"Entity not found: {entity}",
        extensions={"type": "invalid input", "code": "INPUT_ERROR",
                    "userPresentableMessage": f"Could not find referenced {entity}."},
    )  # fmt: skip


def _input_error(argument: str, message: str) -> GraphQLError:
    return GraphQLError(
        f"Argument Validation Error - {argument}: {message}",
        extensions={"type": "invalid input", "code": "INPUT_ERROR", "userPresentableMessage": message},
    )


def _formatted(error: GraphQLError, code: str) -> dict[str, Any]:
    out = error.formatted
    extensions = dict(out.get("extensions") or {})
    extensions.setdefault("code", code)
    extensions.setdefault("type", "graphql error")
    out["extensions"] = extensions
    return dict(out)


def _operation_name(document: graphql.DocumentNode) -> str:
    for definition in document.definitions:
        if isinstance(definition, graphql.OperationDefinitionNode):
            return definition.name.value if definition.name else definition.operation.value
    return "?"
