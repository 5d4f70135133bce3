"""What each MCP tool does to the world, as MCP tool annotations: a human title and the hints clients use to decide
what needs a person's confirmation (`readOnlyHint`, `destructiveHint`, `idempotentHint`; none of taskgate's tools
reaches outside taskgate's own database, repositories and tracker, so `openWorldHint` is false for all).

- read only: changes nothing anywhere;
- destructive: may discard or overwrite something (a cancelled session, a merged base, a replaced output file, a
  dropped workflow frame); additive writes (a plan, a task, a step forward) are not;
- idempotent: the same call again changes nothing more (a decision replays; a ticked item stays ticked).

`tests/mcp/test_docs_mcp.py` keeps this table equal to the tool list.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from mcp.types import ToolAnnotations

from taskgate.domain.access import Capability, Permission, required_permission

READ, WRITE, DESTRUCTIVE = "read", "write", "destructive"

# tool → (title, effect, idempotent)
TABLE: dict[str, tuple[str, str, bool]] = {
    "ping": ("Ping", READ, True),
    "project_init": ("Register a repository as a project", WRITE, False),
    "plan_add": ("Add a plan", WRITE, False),
    "plan_list": ("List plans", READ, True),
    "task_add": ("Add a task", WRITE, False),
    "task_list": ("List tasks", READ, True),
    "project_ready_tasks": ("Tasks ready to start", READ, True),
    "project_session_start": ("Start a session on a task", WRITE, False),
    "project_sessions_ready": ("Sessions waiting for review", READ, True),
    "project_decide": ("Decide on a session (approve, request changes, reject)", DESTRUCTIVE, True),
    "session_execute": ("Run the session's agents", WRITE, False),
    "session_status": ("Session status", READ, True),
    "session_history": ("Session transition history", READ, True),
    "session_state_at": ("Session state at a time", READ, True),
    "session_fire": ("Fire a trigger on a session", DESTRUCTIVE, False),
    "session_suspend": ("Suspend a session", WRITE, False),
    "session_resume": ("Resume a session", WRITE, False),
    "session_cancel": ("Cancel a session", DESTRUCTIVE, False),
    "session_stop": ("Stop a session's agents", DESTRUCTIVE, False),
    "project_session_merge": ("Merge an approved session", DESTRUCTIVE, False),
    "session_review": ("Review a session's changes", READ, True),
    "session_review_checkpoint": ("Store a review checkpoint", WRITE, False),
    "context_discover": ("Project context (git and tracker)", READ, True),
    "audit_query": ("Query the audit log", READ, True),
    "audit_status": ("The audit log's last checkpoint and verification", READ, True),
    "audit_verify": ("Verify the audit log's chains and checkpoints", WRITE, False),
    "audit_checkpoint": ("Sign an audit checkpoint now", WRITE, False),
    "policies_list": ("List policies", READ, True),
    "policies_check": ("Dry-run the policies of a trigger", READ, True),
    "save_output": ("Save a file into the session folder", DESTRUCTIVE, True),
    "query_workflows": ("List workflows", READ, True),
    "query_checklists": ("List checklists", READ, True),
    "add_workflow_to_session": ("Push a workflow onto a session", WRITE, False),
    "add_checklist_to_session": ("Push a checklist onto a session", WRITE, False),
    "checklist_check": ("Tick a checklist item", WRITE, True),
    "workflow_advance": ("Skip the current workflow step", WRITE, False),
    "workflow_back": ("Go back one workflow step", WRITE, False),
    "workflow_break": ("Leave the nested workflow", DESTRUCTIVE, False),
    "workflow_continue": ("End the nested workflow early", DESTRUCTIVE, False),
    "workflow_restart": ("Restart the top workflow", DESTRUCTIVE, False),
    "session_list": ("List sessions", READ, True),
    "events_list": ("List events", READ, True),
    "nodes_list": ("List nodes", READ, True),
    "session_adopt": ("Adopt a down node's session", WRITE, False),
    "tracker_status": ("Write-backs owed to the tracker", READ, True),
    "tracker_retry": ("Retry a tracker write-back", WRITE, False),
    "tracker_dismiss": ("Dismiss a tracker write-back", WRITE, False),
    "operator_list": ("List operators", READ, True),
    "operator_add": ("Add an operator", WRITE, False),
    "operator_grant": ("Grant an operator roles or permissions", WRITE, True),
    "plan_close": ("Close a plan", WRITE, True),
    "ask_operator": ("Ask the operator and wait for the answer", WRITE, False),
    "permission_prompt": ("Ask the operator to allow a tool use", WRITE, False),
    "question_list": ("Agents' questions waiting for an operator", READ, True),
    "session_answer": ("Answer an agent's question", WRITE, True),
}


# What each tool asks of its caller (the capability it authorizes), for showing a principal only what it may use;
# `project_session_merge` fires `merge`, which needs approve. None: anyone (ping).
NEEDS: dict[str, Capability | None] = {
    "ping": None,
    **dict.fromkeys(["project_init", "plan_add", "task_add"], Capability.MANAGE),
    **dict.fromkeys(["plan_list", "task_list", "project_ready_tasks", "project_sessions_ready", "policies_list",
                     "query_workflows", "query_checklists", "session_list", "tracker_status", "nodes_list"],
                    Capability.READ),
    **dict.fromkeys(["project_session_start", "session_execute"], Capability.START),
    **dict.fromkeys(["project_decide", "session_review_checkpoint", "project_session_merge", "tracker_dismiss",
                     "session_adopt"],
                    Capability.DECIDE),
    **dict.fromkeys(["session_status", "session_history", "session_state_at", "session_review", "context_discover",
                     "policies_check"], Capability.READ_SESSION),
    **dict.fromkeys(["session_fire", "session_suspend", "session_resume", "session_cancel", "session_stop",
                     "tracker_retry"],
                    Capability.FIRE),
    **dict.fromkeys(["add_workflow_to_session", "add_checklist_to_session", "checklist_check", "workflow_advance",
                     "workflow_back", "workflow_break", "workflow_continue", "workflow_restart"], Capability.STEER),
    **dict.fromkeys(["audit_query", "audit_status", "audit_verify"], Capability.AUDIT),
    "audit_checkpoint": Capability.SIGN_AUDIT,
    "events_list": Capability.AUDIT,
    "save_output": Capability.SAVE_OUTPUT,
    "operator_list": Capability.READ,
    **dict.fromkeys(["operator_add", "operator_grant"], Capability.ADMINISTER),
    "plan_close": Capability.MANAGE,
    **dict.fromkeys(["ask_operator", "permission_prompt"], Capability.ASK),
    "question_list": Capability.READ,
    "session_answer": Capability.DECIDE,
}  # fmt: skip

AGENT_TOOLS = frozenset({
    "ping", "session_status", "session_history", "session_state_at", "session_review", "context_discover",
    "policies_check", "session_fire", "save_output", "add_workflow_to_session", "add_checklist_to_session",
    "checklist_check", "workflow_advance", "workflow_back", "workflow_break", "workflow_continue", "workflow_restart",
    "ask_operator", "permission_prompt",
})  # fmt: skip
"""What an agent token may call, on its own session only (domain/access.py: read it, fire plan_complete,
work_complete or fail, steer its workflow stack, save outputs). The others would refuse it."""


def visible_to_operator(tool: str, permissions: frozenset[Permission]) -> bool:
    """Whether an operator holding `permissions` may call `tool` at all."""
    needs = NEEDS[tool]
    return needs is None or required_permission(needs) in permissions


def annotated(fn: Callable[..., Any]) -> dict[str, Any]:
    """The `add_tool` keywords for `fn`: its title, annotations and its docstring without source indentation.

    Raises: KeyError when the tool is missing from TABLE (a test keeps them equal).
    """
    title, effect, idempotent = TABLE[fn.__name__]
    hints = ToolAnnotations(
        title=title,
        readOnlyHint=effect == READ,
        destructiveHint=effect == DESTRUCTIVE,
        idempotentHint=idempotent,
        openWorldHint=False,
    )
    return {"title": title, "annotations": hints, "description": inspect.cleandoc(fn.__doc__ or "")}
