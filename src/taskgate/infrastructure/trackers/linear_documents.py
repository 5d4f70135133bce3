"""The GraphQL documents LinearTracker sends to Linear. They are plain strings on purpose: tests/contract validates each
against Linear's schema as converted from @linear/sdk (tests/support/linear_api/schema.graphql), so a field Linear
renames or retypes fails there, not in production."""

from __future__ import annotations

PAGE = 100  # issues per page (Linear's maximum `first` is 250; 100 keeps each request's complexity modest)
NESTED = 50  # labels, sub-issues and relations read per issue; more than that is reported, not silently cut

ISSUE_FIELDS = f"""
fragment TaskgateIssue on Issue {{
  id
  identifier
  title
  description
  priority
  url
  archivedAt
  team {{ id key }}
  state {{ id name type }}
  assignee {{ id name email }}
  labels(first: {NESTED}) {{ nodes {{ name }} pageInfo {{ hasNextPage }} }}
  children(first: {NESTED}) {{ nodes {{ identifier state {{ name type }} }} pageInfo {{ hasNextPage }} }}
  inverseRelations(first: {NESTED}) {{
    nodes {{ type issue {{ identifier state {{ name type }} }} }}
    pageInfo {{ hasNextPage }}
  }}
}}
"""

ISSUES = (
    f"""
query TaskgateIssues($filter: IssueFilter!, $after: String) {{
  issues(filter: $filter, first: {PAGE}, after: $after, includeArchived: false) {{
    nodes {{ ...TaskgateIssue }}
    pageInfo {{ hasNextPage endCursor }}
  }}
}}
"""
    + ISSUE_FIELDS
)

ISSUE = (
    """
query TaskgateIssue($id: String!) {
  issue(id: $id) { ...TaskgateIssue }
}
"""
    + ISSUE_FIELDS
)

VIEWER = """
query TaskgateViewer {
  viewer { id name email }
}
"""

USER_BY_EMAIL = """
query TaskgateUserByEmail($email: String!) {
  users(filter: {email: {eq: $email}}, first: 2) { nodes { id name email } }
}
"""

TEAM_STATES = """
query TaskgateTeamStates($team: String!) {
  teams(filter: {key: {eq: $team}}, first: 2) {
    nodes { id key name states(first: 100) { nodes { id name type } } }
  }
}
"""

ISSUE_UPDATE = """
mutation TaskgateIssueUpdate($id: String!, $input: IssueUpdateInput!) {
  issueUpdate(id: $id, input: $input) {
    success
    issue { id identifier state { name } assignee { id } }
  }
}
"""

COMMENT_CREATE = """
mutation TaskgateCommentCreate($input: CommentCreateInput!) {
  commentCreate(input: $input) { success comment { id } }
}
"""

ALL = {
    "ISSUES": ISSUES,
    "ISSUE": ISSUE,
    "VIEWER": VIEWER,
    "USER_BY_EMAIL": USER_BY_EMAIL,
    "TEAM_STATES": TEAM_STATES,
    "ISSUE_UPDATE": ISSUE_UPDATE,
    "COMMENT_CREATE": COMMENT_CREATE,
}
