"""Contract: taskgate's Linear documents against Linear's schema, and the Linear stand-in against both.

The schema (tests/support/linear_api/schema.graphql) is converted from @linear/sdk 98.0.0's codegen TypeScript by
schema_from_sdk.py. The SDK's own documents (sdk_documents/, copied from its dist/index.mjs) validating against it is
what shows the conversion faithful: they were written against Linear's real schema. taskgate's documents validating
against it is what keeps LinearTracker's queries honest. The stand-in executes requests against the same schema, so
its answers have the shape each document asks for, and it refuses what Linear would refuse.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import graphql
import httpx
import pytest

from taskgate.infrastructure.trackers import linear_documents
from tests.support.linear_api import LinearStandIn
from tests.support.linear_api.standin import SCHEMA_PATH

SDK_DOCUMENTS = sorted((Path(__file__).parents[1] / "support" / "linear_api" / "sdk_documents").glob("*.graphql"))
KEY = "lin_api_test"


@pytest.fixture(scope="module")
def schema() -> graphql.GraphQLSchema:
    built = graphql.build_schema(SCHEMA_PATH.read_text())
    assert graphql.validate_schema(built) == []
    return built


@pytest.fixture
def linear() -> Iterator[LinearStandIn]:
    with LinearStandIn(key=KEY) as standin:
        yield standin


def _post(linear: LinearStandIn, query: str, variables: dict | None = None, key: str = KEY) -> httpx.Response:
    return httpx.post(linear.url, json={"query": query, "variables": variables or {}}, headers={"Authorization": key})


def test_the_schema_names_its_source() -> None:
    head = SCHEMA_PATH.read_text().splitlines()[0]
    assert "@linear/sdk 98.0.0" in head


@pytest.mark.parametrize("name", sorted(linear_documents.ALL))
def test_taskgate_documents_validate_against_linears_schema(schema: graphql.GraphQLSchema, name: str) -> None:
    assert graphql.validate(schema, graphql.parse(linear_documents.ALL[name])) == []


@pytest.mark.parametrize("path", SDK_DOCUMENTS, ids=lambda p: p.stem)
def test_the_sdks_own_documents_validate_against_the_converted_schema(
    schema: graphql.GraphQLSchema, path: Path
) -> None:
    assert graphql.validate(schema, graphql.parse(path.read_text())) == []


def test_the_sdk_documents_are_the_ones_asked_for() -> None:
    assert {p.stem for p in SDK_DOCUMENTS} >= {"Issues", "Issue", "Viewer", "UpdateIssue", "CreateComment"}


def test_the_converted_schema_keeps_nullability_lists_and_arguments(schema: graphql.GraphQLSchema) -> None:
    issue = schema.type_map["Issue"]
    assert isinstance(issue, graphql.GraphQLObjectType)
    assert str(issue.fields["identifier"].type) == "String!"
    assert str(issue.fields["assignee"].type) == "User"
    assert str(issue.fields["children"].type) == "IssueConnection!"
    assert {"first", "after", "filter"} <= set(issue.fields["children"].args)
    assert str(schema.query_type.fields["issue"].args["id"].type) == "String!"  # type: ignore[union-attr]
    assert isinstance(schema.type_map["IssueFilter"], graphql.GraphQLInputObjectType)
    assert isinstance(schema.type_map["IssueUpdateInput"], graphql.GraphQLInputObjectType)
    assert [i.name for i in issue.interfaces] == ["Node"] or "Node" in [i.name for i in issue.interfaces]


def test_the_standin_answers_the_issues_document_in_its_shape(linear: LinearStandIn) -> None:
    blocker = linear.add_issue("ENG", "Blocker", state="In Progress")
    blocked = linear.add_issue("ENG", "Blocked", priority=2, labels=["taskgate"])
    linear.block(blocker, blocked)
    variables = {"filter": {"team": {"key": {"eq": "ENG"}}, "state": {"name": {"in": ["Todo"]}}}, "after": None}
    resp = _post(linear, linear_documents.ISSUES, variables)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert "errors" not in body
    (node,) = body["data"]["issues"]["nodes"]
    assert node["identifier"] == blocked and node["priority"] == 2 and node["team"]["key"] == "ENG"
    assert node["state"] == {"id": node["state"]["id"], "name": "Todo", "type": "unstarted"}
    assert node["labels"]["nodes"] == [{"name": "taskgate"}]
    assert node["inverseRelations"]["nodes"] == [
        {"type": "blocks", "issue": {"identifier": blocker, "state": {"name": "In Progress", "type": "started"}}}
    ]
    assert body["data"]["issues"]["pageInfo"]["hasNextPage"] is False


def test_the_standin_names_the_fields_it_does_not_keep(linear: LinearStandIn) -> None:
    """The SDK's own `viewer` document is valid, but selects fields the stand-in has no data for: it says so rather
    than inventing them."""
    text = next(p for p in SDK_DOCUMENTS if p.stem == "Viewer").read_text()
    resp = _post(linear, text)
    assert resp.status_code == 200
    messages = [e["message"] for e in resp.json()["errors"]]
    assert any("the Linear stand-in does not implement User." in m for m in messages)


def test_the_standin_answers_an_issue_by_identifier(linear: LinearStandIn) -> None:
    ident = linear.add_issue("ENG", "One", description="the first")
    issue = _post(linear, linear_documents.ISSUE, {"id": ident}).json()["data"]["issue"]
    assert (issue["identifier"], issue["title"], issue["description"]) == (ident, "One", "the first")
    assert issue["id"] == linear.issue(ident)["id"]
    missing = _post(linear, linear_documents.ISSUE, {"id": "ENG-999"}).json()  # Query.issue is Issue!: data null
    assert missing["data"] is None and missing["errors"][0]["message"] == "Entity not found: Issue"


def test_the_standin_refuses_an_invalid_document_as_linear_does(linear: LinearStandIn) -> None:
    resp = _post(linear, 'query { issue(id: "ENG-1") { identifier nonsense } }')
    assert resp.status_code == 400
    (error,) = resp.json()["errors"]
    assert "Cannot query field 'nonsense' on type 'Issue'" in error["message"]
    assert error["extensions"]["code"] == "GRAPHQL_VALIDATION_FAILED"


def test_the_standin_refuses_a_variable_of_the_wrong_type(linear: LinearStandIn) -> None:
    resp = _post(linear, linear_documents.ISSUES, {"filter": {"team": {"key": {"equals": "ENG"}}}})
    body = resp.json()
    assert body["errors"] and "equals" in body["errors"][0]["message"]


def test_the_standin_names_a_filter_field_it_does_not_implement(linear: LinearStandIn) -> None:
    resp = _post(linear, linear_documents.ISSUES, {"filter": {"dueDate": {"eq": "2026-01-01"}}})
    body = resp.json()
    assert "does not implement the filter field 'dueDate'" in body["errors"][0]["message"]


def test_the_standin_refuses_a_bad_key_with_linears_authentication_error(linear: LinearStandIn) -> None:
    resp = _post(linear, linear_documents.VIEWER, key="lin_api_wrong")
    assert resp.status_code in (400, 401)
    assert resp.json()["errors"][0]["extensions"]["code"] == "AUTHENTICATION_ERROR"


def test_the_standin_pages_with_cursors(linear: LinearStandIn) -> None:
    for n in range(120):
        linear.add_issue("ENG", f"Issue {n}")
    variables: dict = {"filter": {"team": {"key": {"eq": "ENG"}}}, "after": None}
    first = _post(linear, linear_documents.ISSUES, variables).json()["data"]["issues"]
    assert len(first["nodes"]) == 100 and first["pageInfo"]["hasNextPage"]
    variables["after"] = first["pageInfo"]["endCursor"]
    second = _post(linear, linear_documents.ISSUES, variables).json()["data"]["issues"]
    assert len(second["nodes"]) == 20 and not second["pageInfo"]["hasNextPage"]
    assert {n["identifier"] for n in first["nodes"]}.isdisjoint(n["identifier"] for n in second["nodes"])


def test_the_standin_executes_the_mutations(linear: LinearStandIn) -> None:
    ident = linear.add_issue("ENG", "Move me")
    states = _post(linear, linear_documents.TEAM_STATES, {"team": "ENG"}).json()["data"]["teams"]["nodes"][0]
    done = next(s["id"] for s in states["states"]["nodes"] if s["name"] == "Done")
    uuid = linear.issue(ident)["id"]
    resp = _post(linear, linear_documents.ISSUE_UPDATE, {"id": uuid, "input": {"stateId": done}}).json()
    assert resp["data"]["issueUpdate"]["success"] and resp["data"]["issueUpdate"]["issue"]["state"]["name"] == "Done"
    resp = _post(linear, linear_documents.COMMENT_CREATE, {"input": {"issueId": uuid, "body": "hello"}}).json()
    assert resp["data"]["commentCreate"]["success"]
    assert linear.issue(ident)["comments"] == ["hello"] and linear.issue(ident)["state"] == "Done"
