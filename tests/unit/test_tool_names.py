"""The two tool-name styles (entrypoints/mcp/names.py): the seed's colon names, and text renamed into a style."""

from __future__ import annotations

from taskgate.entrypoints.mcp.names import COLON, canonical, renamed, tool_name
from taskgate.entrypoints.mcp.tools import TOOLS


def test_the_seeds_names_and_the_tools_its_workflows_call_by_their_underscore_names() -> None:
    names = {fn.__name__: tool_name(fn.__name__, "colon") for fn in TOOLS}
    assert names["project_session_start"] == "project:session_start" and names["project_decide"] == "project:decide"
    for unchanged in ("ping", "save_output", "query_workflows", "add_workflow_to_session", "add_checklist_to_session"):
        assert names[unchanged] == unchanged
    assert set(COLON) <= set(names) and len(set(names.values())) == len(names)  # no two tools share a name
    assert all(tool_name(fn.__name__, "underscore") == fn.__name__ for fn in TOOLS)


def test_text_names_tools_in_the_servers_style_and_either_name_finds_the_tool() -> None:
    said = "workflow_break leaves a nested frame; answer it with project_decide (not project_decide_later)"
    assert renamed(said, "colon") == (
        "workflow:break leaves a nested frame; answer it with project:decide (not project_decide_later)"
    )
    assert renamed(said, "underscore") == said and renamed("session:fire", "colon") == "session:fire"
    assert canonical("project:session_start") == "project_session_start" == canonical("project_session_start")
