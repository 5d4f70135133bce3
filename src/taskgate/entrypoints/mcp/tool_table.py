"""Generates `tool_table.json` (handshake.py) from the registered server: what `tools/list` sends for every tool in
the underscore style, in registration order.

Run after changing a tool's signature, docstring, output model or annotations:

    python -m taskgate.entrypoints.mcp.tool_table

`tests/mcp/test_tool_table.py` fails, naming this command, when the file differs from what the server lists.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from typing import Any

from taskgate.entrypoints.mcp.handshake import TABLE_FILE
from taskgate.entrypoints.mcp.names import ToolNames
from taskgate.entrypoints.mcp.server import build_server


@asynccontextmanager
async def _never_opened() -> Any:
    raise AssertionError("listing tools opens no services")
    yield  # pragma: no cover


async def registered_rows(tool_names: ToolNames = "underscore") -> list[dict[str, Any]]:
    """Every tool the full server registers, as `tools/list` sends it (no caller filtering)."""
    server = build_server(_never_opened, local_principal=None, tool_names=tool_names)
    return [wire(tool) for tool in await server.list_tools()]


def wire(tool: Any) -> dict[str, Any]:
    """A tool (`mcp.types.Tool`) as JSON on the wire."""
    return tool.model_dump(mode="json", by_alias=True, exclude_none=True)


def render(rows: list[dict[str, Any]]) -> str:
    """The file's text: one tool per line, so a change shows as the lines of the tools it touched."""
    return "[\n" + ",\n".join(json.dumps(row, ensure_ascii=False, sort_keys=True) for row in rows) + "\n]\n"


def main() -> None:
    """Write the table of the registered tools to `tool_table.json`."""
    TABLE_FILE.write_text(render(asyncio.run(registered_rows())), encoding="utf-8")
    print(f"wrote {TABLE_FILE}")


if __name__ == "__main__":
    main()
