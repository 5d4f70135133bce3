"""Issues: the endpoints taskgate's GitHub Issues tracker uses, over records kept beside the forge's pulls.

Issues and pull requests share one number sequence (as on GitHub) and pull requests appear in the issue list with
a `pull_request` key. Dependencies ("blocked by") and sub-issues are kept as numbers; the issue JSON carries
GitHub's `issue_dependencies_summary` (open blockers in `blocked_by`) and `sub_issues_summary`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tests.support.github_api.forge import Forge, Refused, now
from tests.support.github_api.records import PullRecord
from tests.support.github_api.server import Reply, Request
from tests.support.github_api.shapes import HTML, iso, node_id, stable_id, user

Pager = Callable[[Request, list[Any]], tuple[list[Any], dict[str, str]]]


@dataclass
class IssueComment:
    id: int
    user: str
    body: str
    created_at: datetime


@dataclass
class IssueRecord:
    """One issue (not a pull request)."""

    number: int
    id: int
    title: str
    body: str | None
    user: str
    created_at: datetime
    updated_at: datetime
    labels: list[str] = field(default_factory=list)
    assignees: list[str] = field(default_factory=list)
    blocked_by: list[int] = field(default_factory=list)
    parent: int | None = None
    state: str = "open"
    state_reason: str | None = None
    closed_at: datetime | None = None
    closed_by: str | None = None
    comments: list[IssueComment] = field(default_factory=list)

    def touch(self) -> None:
        self.updated_at = now()


class Issues:
    """The issues of the stand-in's repository; every method runs under the forge's lock."""

    def __init__(self, forge: Forge, page: Pager, login: Callable[[], str]) -> None:
        self.forge = forge
        self.records: dict[int, IssueRecord] = {}
        self.races: dict[int, str] = {}  # issue number → login that wins the next POST assignees first
        self._page = page
        self._login = login

    def routes(self, repo: str) -> list[tuple[str, str, Callable[..., Reply]]]:
        """(method, path regex, handler) of every issue endpoint; `repo` is the escaped /repos/o/r prefix."""
        n = rf"{repo}/issues/(\d+)"
        return [
            ("GET", rf"{repo}/issues", self.list_issues),
            ("GET", n, self.get_issue),
            ("PATCH", n, self.update_issue),
            ("POST", rf"{n}/assignees", self.add_assignees),
            ("DELETE", rf"{n}/assignees", self.remove_assignees),
            ("POST", rf"{n}/labels", self.add_labels),
            ("DELETE", rf"{n}/labels/(.+)", self.remove_label),
            ("GET", rf"{n}/comments", self.list_comments),
            ("POST", rf"{n}/comments", self.create_comment),
            ("GET", rf"{n}/dependencies/blocked_by", self.list_blocked_by),
            ("GET", rf"{n}/sub_issues", self.list_sub_issues),
            ("GET", r"/user", self.get_user),
        ]

    # -- controls (tests) ----------------------------------------------------------------------------------

    def add(self, title: str, body: str, labels: Any, assignees: Any, blocked_by: Any, parent: int | None) -> int:
        moment = now()
        rec = IssueRecord(self.forge.next_number(), self.forge.next_id(), title, body, self.forge.site.owner,
                          moment, moment, list(labels), list(assignees), list(blocked_by), parent)  # fmt: skip
        self.records[rec.number] = rec
        return rec.number

    def issue(self, number: int) -> IssueRecord:
        rec = self.records.get(number)
        if rec is None:
            raise Refused(404, "Not Found")
        return rec

    def close(self, rec: IssueRecord, login: str, reason: str = "completed") -> None:
        if rec.state != "closed":
            rec.state, rec.state_reason, rec.closed_at, rec.closed_by = "closed", reason, now(), login
            rec.touch()

    def summary(self, rec: IssueRecord) -> dict[str, Any]:
        """What a test reads: the issue's state, labels, assignees and comment bodies."""
        return {"number": rec.number, "title": rec.title, "body": rec.body, "state": rec.state,
                "state_reason": rec.state_reason, "labels": list(rec.labels), "assignees": list(rec.assignees),
                "comments": [c.body for c in rec.comments], "blocked_by": list(rec.blocked_by),
                "parent": rec.parent}  # fmt: skip

    # -- JSON --------------------------------------------------------------------------------------------

    def label_json(self, name: str) -> dict[str, Any]:
        lid = stable_id(f"label:{name}")
        return {"id": lid, "node_id": node_id("LA", lid), "url": f"{self.forge.site.repo_api}/labels/{name}",
                "name": name, "description": None, "color": "ededed", "default": False,
                "archived_at": None, "archived_by": None}  # fmt: skip

    def issue_json(self, rec: IssueRecord) -> dict[str, Any]:
        site = self.forge.site
        api, html = f"{site.repo_api}/issues/{rec.number}", f"{site.repo_html}/issues/{rec.number}"
        blockers = [self.records[b] for b in rec.blocked_by if b in self.records]
        blocking = [r for r in self.records.values() if rec.number in r.blocked_by]
        children = [r for r in self.records.values() if r.parent == rec.number]
        done = sum(1 for c in children if c.state == "closed")
        body = self._common(rec.number, rec.id, api, html, rec.title, rec.body, rec.user, rec.state)
        body.update({
            "state_reason": rec.state_reason,
            "labels": [self.label_json(name) for name in rec.labels],
            "assignee": user(site, rec.assignees[0]) if rec.assignees else None,
            "assignees": [user(site, login) for login in rec.assignees],
            "comments": len(rec.comments),
            "closed_at": iso(rec.closed_at),
            "created_at": iso(rec.created_at),
            "updated_at": iso(rec.updated_at),
            "closed_by": user(site, rec.closed_by) if rec.closed_by else None,
            "sub_issues_summary": {"total": len(children), "completed": done,
                                   "percent_completed": done * 100 // len(children) if children else 0},
            "issue_dependencies_summary": {
                "blocked_by": sum(1 for b in blockers if b.state == "open"),
                "blocking": sum(1 for b in blocking if b.state == "open"),
                "total_blocked_by": len(blockers),
                "total_blocking": len(blocking),
            },
        })  # fmt: skip
        if rec.parent is not None:
            body["parent_issue_url"] = f"{site.repo_api}/issues/{rec.parent}"
        return body

    def pull_issue_json(self, pull: PullRecord) -> dict[str, Any]:
        """A pull request as the issue list shows it (with `pull_request`)."""
        site = self.forge.site
        api, html = f"{site.repo_api}/issues/{pull.number}", f"{site.repo_html}/pull/{pull.number}"
        body = self._common(pull.number, pull.id, api, html, pull.title, pull.body, pull.user, pull.state)
        body.update({
            "state_reason": None, "labels": [], "assignee": None, "assignees": [], "comments": 0,
            "closed_at": iso(pull.closed_at), "created_at": iso(pull.created_at), "updated_at": iso(pull.updated_at),
            "draft": pull.draft,
            "pull_request": {"url": f"{site.repo_api}/pulls/{pull.number}", "html_url": html,
                             "diff_url": f"{html}.diff", "patch_url": f"{html}.patch",
                             "merged_at": iso(pull.merged_at)},
        })  # fmt: skip
        return body

    def _common(self, number: int, iid: int, api: str, html: str, title: str, body: str | None, login: str,
                state: str) -> dict[str, Any]:  # fmt: skip
        return {
            "id": iid, "node_id": node_id("I", iid), "url": api, "repository_url": self.forge.site.repo_api,
            "labels_url": f"{api}/labels{{/name}}", "comments_url": f"{api}/comments", "events_url": f"{api}/events",
            "timeline_url": f"{api}/timeline", "html_url": html, "number": number, "state": state, "title": title,
            "body": body, "user": user(self.forge.site, login), "milestone": None, "locked": False,
            "active_lock_reason": None, "author_association": "MEMBER",
        }  # fmt: skip

    def comment_json(self, rec: IssueRecord, c: IssueComment) -> dict[str, Any]:
        site = self.forge.site
        return {"id": c.id, "node_id": node_id("IC", c.id), "url": f"{site.repo_api}/issues/comments/{c.id}",
                "html_url": f"{site.repo_html}/issues/{rec.number}#issuecomment-{c.id}", "body": c.body,
                "user": user(site, c.user), "created_at": iso(c.created_at), "updated_at": iso(c.created_at),
                "issue_url": f"{site.repo_api}/issues/{rec.number}", "author_association": "MEMBER"}  # fmt: skip

    # -- endpoints ---------------------------------------------------------------------------------------

    def list_issues(self, req: Request) -> Reply:
        """GET /repos/{o}/{r}/issues: state, labels (all of them), assignee (a login, `none`, `*`), newest first."""
        state = req.query.get("state", "open")
        if state not in ("open", "closed", "all"):
            raise invalid("state")
        wanted = [name.strip() for name in req.query.get("labels", "").split(",") if name.strip()]
        assignee = req.query.get("assignee")
        items: list[IssueRecord | PullRecord] = [
            rec
            for rec in self.records.values()
            if state in ("all", rec.state) and all(w in rec.labels for w in wanted) and _assigned(rec, assignee)
        ]
        if not wanted and assignee in (None, "none"):  # the stand-in's pull requests have no labels or assignees
            items += [p for p in self.forge.pulls.values() if state in ("all", p.state)]
        items.sort(key=lambda item: item.number, reverse=req.query.get("direction") != "asc")
        page, headers = self._page(req, items)  # JSON for the page only: a list of thousands stays quick
        page = [self.issue_json(i) if isinstance(i, IssueRecord) else self.pull_issue_json(i) for i in page]
        return Reply(200, page, headers)

    def get_issue(self, req: Request, number: str) -> Reply:
        """GET /repos/{o}/{r}/issues/{n} (a pull request's number answers its issue face)."""
        pull = self.forge.pulls.get(int(number))
        if pull is not None:
            return Reply(200, self.pull_issue_json(pull))
        return Reply(200, self.issue_json(self.issue(int(number))))

    def update_issue(self, req: Request, number: str) -> Reply:
        """PATCH /repos/{o}/{r}/issues/{n}: title, body, state, state_reason, labels, assignees (replacing)."""
        data = _data(req)
        rec = self.issue(int(number))
        if data.get("state") not in (None, "open", "closed"):
            raise invalid("state")
        if data.get("state_reason") not in (None, "completed", "not_planned", "duplicate", "reopened"):
            raise invalid("state_reason")
        for name in ("title", "body"):
            if name in data:
                setattr(rec, name, data[name])
        if "labels" in data:
            rec.labels = _names(data["labels"])
        if "assignees" in data:
            rec.assignees = _unique(data["assignees"] or [])
        if data.get("state") == "closed":
            self.close(rec, self._login(), data.get("state_reason") or "completed")
        elif data.get("state") == "open" and rec.state == "closed":
            rec.state, rec.state_reason, rec.closed_at, rec.closed_by = "open", "reopened", None, None
        rec.touch()
        return Reply(200, self.issue_json(rec))

    def add_assignees(self, req: Request, number: str) -> Reply:
        """POST …/assignees: adds (GitHub keeps at most 10; unknown logins are dropped silently)."""
        data = _data(req)
        rec = self.issue(int(number))
        racer = self.races.pop(rec.number, None)
        if racer is not None and racer not in rec.assignees:
            rec.assignees.append(racer)  # a concurrent claimer's add landed first
        rec.assignees = _unique([*rec.assignees, *_logins(data)])[:10]
        rec.touch()
        return Reply(201, self.issue_json(rec))

    def remove_assignees(self, req: Request, number: str) -> Reply:
        """DELETE …/assignees."""
        data = _data(req)
        rec = self.issue(int(number))
        gone = set(_logins(data))
        rec.assignees = [login for login in rec.assignees if login not in gone]
        rec.touch()
        return Reply(200, self.issue_json(rec))

    def add_labels(self, req: Request, number: str) -> Reply:
        """POST …/labels: `{"labels": [...]}` or a bare list; creates unknown labels, as GitHub does."""
        data = _data(req)
        rec = self.issue(int(number))
        given = data.get("labels", []) if isinstance(data, dict) else data
        rec.labels = _unique([*rec.labels, *_names(given)])
        rec.touch()
        return Reply(200, [self.label_json(name) for name in rec.labels])

    def remove_label(self, req: Request, number: str, name: str) -> Reply:
        """DELETE …/labels/{name}: 404 `Label does not exist` when the issue does not have it."""
        rec = self.issue(int(number))
        if name not in rec.labels:
            raise Refused(404, "Label does not exist")
        rec.labels.remove(name)
        rec.touch()
        return Reply(200, [self.label_json(label) for label in rec.labels])

    def list_comments(self, req: Request, number: str) -> Reply:
        rec = self.issue(int(number))
        page, headers = self._page(req, rec.comments)
        return Reply(200, [self.comment_json(rec, c) for c in page], headers)

    def create_comment(self, req: Request, number: str) -> Reply:
        data = _data(req)
        rec = self.issue(int(number))
        if not isinstance(data.get("body"), str) or not data["body"]:
            raise invalid("body", code="missing_field")
        comment = IssueComment(self.forge.next_id(), self._login(), data["body"], now())
        rec.comments.append(comment)
        rec.touch()
        body = self.comment_json(rec, comment)
        return Reply(201, body, {"Location": body["url"]})

    def list_blocked_by(self, req: Request, number: str) -> Reply:
        """GET …/dependencies/blocked_by: every blocker, open or closed."""
        rec = self.issue(int(number))
        blockers = [self.records[b] for b in rec.blocked_by if b in self.records]
        page, headers = self._page(req, blockers)
        return Reply(200, [self.issue_json(b) for b in page], headers)

    def list_sub_issues(self, req: Request, number: str) -> Reply:
        rec = self.issue(int(number))
        children = sorted((r for r in self.records.values() if r.parent == rec.number), key=lambda r: r.number)
        page, headers = self._page(req, children)
        return Reply(200, [self.issue_json(c) for c in page], headers)

    def get_user(self, req: Request) -> Reply:
        """GET /user: the token's user (a PublicUser)."""
        login = self._login()
        body = user(self.forge.site, login)
        body.update({"name": login, "company": None, "blog": "", "location": None, "email": None,
                     "hireable": None, "bio": None, "public_repos": 0, "public_gists": 0, "followers": 0,
                     "following": 0, "created_at": iso(self.forge.site.created),
                     "updated_at": iso(self.forge.site.created), "html_url": f"{HTML}/{login}"})  # fmt: skip
        return Reply(200, body)


def invalid(*fields: str, code: str = "invalid") -> Refused:
    """GitHub's 422 for invalid (or missing) issue fields."""
    return Refused(422, "Validation Failed", errors=[{"resource": "Issue", "field": f, "code": code} for f in fields])


def _data(req: Request) -> Any:
    try:
        data = json.loads(req.body or b"{}")
    except ValueError:
        raise Refused(400, "Problems parsing JSON") from None
    if not isinstance(data, (dict, list)):
        raise Refused(400, "Problems parsing JSON")
    return data


def _assigned(rec: IssueRecord, assignee: str | None) -> bool:
    if assignee is None:
        return True
    if assignee == "none":
        return not rec.assignees
    if assignee == "*":
        return bool(rec.assignees)
    return assignee in rec.assignees


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(str(item) for item in items))


def _names(labels: Any) -> list[str]:
    if not isinstance(labels, list):
        raise invalid("labels")
    return _unique([label["name"] if isinstance(label, dict) else label for label in labels])


def _logins(data: Any) -> list[str]:
    given = data.get("assignees", []) if isinstance(data, dict) else []
    return _unique([given] if isinstance(given, str) else list(given))
