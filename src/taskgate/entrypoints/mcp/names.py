"""Tool names in the two styles: `underscore` (the default, SEP-986's charset) and the seed design's `colon` names.

The colon names are a table, not a rule: splitting at the first underscore gave odd groups (`save:output`,
`add:workflow_to_session`). The seed's own names are kept (`project:session_start`, …), and the tools its nested
workflows call by their underscore names keep them in both styles (`query_workflows`, `add_workflow_to_session`,
`save_output`, which the shipped agents call). In colon style the server's instructions, tool descriptions and
errors name tools the colon way, and a call by the underscore name still works, so an agent written for either
style works with a server in either style. `tests/mcp/test_docs_mcp.py` keeps docs/mcp.md's table equal to this.
"""

from __future__ import annotations

import functools
import re
from typing import Literal

ToolNames = Literal["underscore", "colon"]

COLON: dict[str, str] = {
    "project_init": "project:init",
    "project_ready_tasks": "project:ready_tasks",
    "project_session_start": "project:session_start",
    "project_sessions_ready": "project:sessions_ready",
    "project_decide": "project:decide",
    "project_session_merge": "project:session_merge",
    "plan_add": "plan:add",
    "plan_list": "plan:list",
    "task_add": "task:add",
    "task_list": "task:list",
    "session_execute": "session:execute",
    "session_status": "session:status",
    "session_history": "session:history",
    "session_state_at": "session:state_at",
    "session_fire": "session:fire",
    "session_suspend": "session:suspend",
    "session_resume": "session:resume",
    "session_cancel": "session:cancel",
    "session_stop": "session:stop",
    "session_review": "session:review",
    "session_review_checkpoint": "session:review_checkpoint",
    "session_list": "session:list",
    "context_discover": "context:discover",
    "audit_query": "audit:query",
    "audit_status": "audit:status",
    "audit_verify": "audit:verify",
    "audit_checkpoint": "audit:checkpoint",
    "events_list": "events:list",
    "nodes_list": "nodes:list",
    "session_adopt": "session:adopt",
    "policies_list": "policies:list",
    "policies_check": "policies:check",
    "checklist_check": "checklist:check",
    "workflow_advance": "workflow:advance",
    "workflow_back": "workflow:back",
    "workflow_break": "workflow:break",
    "workflow_continue": "workflow:continue",
    "workflow_restart": "workflow:restart",
    "tracker_status": "tracker:status",
    "tracker_retry": "tracker:retry",
    "tracker_dismiss": "tracker:dismiss",
    "operator_list": "operators:list",
    "operator_add": "operators:add",
    "operator_grant": "operators:grant",
    "plan_close": "plan:close",
}
"""Underscore name → colon name; a tool not listed has one name in both styles (ping, save_output,
query_workflows, query_checklists, add_workflow_to_session, add_checklist_to_session)."""


def tool_name(name: str, style: ToolNames) -> str:
    """The name the server registers a tool under in `style`."""
    return COLON.get(name, name) if style == "colon" else name


def renamed(text: str, style: ToolNames) -> str:
    """`text` (instructions, a description, an error) with every tool it names written in `style`."""
    if style != "colon":
        return text
    return _mention().sub(lambda m: COLON[m.group(1)], text)


@functools.cache
def _mention() -> re.Pattern[str]:
    """Any tool's underscore name as a whole word; compiled on first use (not on serve's path in underscore style)."""
    return re.compile(r"(?<![\w:])(" + "|".join(sorted(COLON, key=len, reverse=True)) + r")(?![\w:])")


def canonical(name: str) -> str:
    """The underscore name of a tool named either way (a colon name, or already an underscore name)."""
    return _UNDERSCORE.get(name, name)


_UNDERSCORE = {colon: underscore for underscore, colon in COLON.items()}
