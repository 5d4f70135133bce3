"""What taskgate's MCP server says before any tool runs: who it is and how to use it (`initialize`) and its tools
(`tools/list`), without importing the tools themselves.

`serve` over stdio answers both from here before its database is open (front.py): the tools' modules import the
services and their models, which take longer than an MCP client waits for the list. The tool list is
`tool_table.json`, generated from the registered server (`python -m taskgate.entrypoints.mcp.tool_table`) and
kept equal to it by `tests/mcp/test_tool_table.py`, so it is never a second copy written by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcp.types import Tool

from taskgate import __version__
from taskgate.entrypoints.mcp.names import ToolNames, renamed, tool_name

TABLE_FILE = Path(__file__).with_name("tool_table.json")
"""Every tool as `tools/list` sends it in the underscore style, in registration order (generated)."""

INSTRUCTIONS = """taskgate runs AI coding agents in guarded, audited sessions, one per task.
Typical flow: project_init (once) → plan_add → task_add → project_ready_tasks → project_session_start(task_id)
→ session_execute(session_id) (agents work; when they end the session is verifying) → session_review(session_id)
→ project_decide(session_id, approve | request_changes with instructions | reject) → project_session_merge
(rebases if needed, merges, then cleans up by itself) → session_history.
project_sessions_ready lists what waits for a decision. session_status lists the triggers allowed next.
Refusals (WIP limit, blocked task, wrong state) come back as tool errors that say why and what to do; they change
nothing. audit_query answers who did what, when."""


def server_keywords(tool_names: ToolNames) -> dict[str, Any]:
    """The keywords of `MCPServer(...)` that make up `initialize`'s answer (name, version, title, instructions),
    the same for the full server and the front.

    WARNING, not the SDK's INFO: the SDK installs Rich logging, and the `transitions` library logs two INFO lines
    per transition, which Rich rendered on the event loop for ~1.4 ms each (measured).
    """
    return {
        "name": "taskgate",
        "version": __version__,
        "instructions": renamed(INSTRUCTIONS, tool_names),
        "title": "taskgate: guarded, audited sessions for AI coding agents",
        "log_level": "WARNING",
    }


def table_rows() -> list[dict[str, Any]]:
    """The generated table: each tool's wire form in the underscore style. Raises: OSError when it is missing."""
    return json.loads(TABLE_FILE.read_bytes())


def listed_tools(rows: list[dict[str, Any]], tool_names: ToolNames, keep: frozenset[str] | None = None) -> list[Tool]:
    """The tools of `rows` as `tools/list` answers in `tool_names` style (names and descriptions renamed as
    `server.build_server` registers them), only those whose underscore name is in `keep` when given."""
    tools = []
    for row in rows:
        if keep is not None and row["name"] not in keep:
            continue
        if tool_names != "underscore":
            row = row | {
                "name": tool_name(row["name"], tool_names),
                "description": renamed(row["description"], tool_names),
            }
        tools.append(Tool.model_validate(row))
    return tools
