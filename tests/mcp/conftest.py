"""Fixtures for the MCP layer: the real server, in-process through the SDK's Client, on any backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from mcp import Client

from taskgate.application.agents.supervisor import AgentService
from taskgate.application.trackers.writebacks import WritebackService
from taskgate.application.workflows.engine import WorkflowEngine
from taskgate.bootstrap import App
from taskgate.domain.access import Principal
from taskgate.entrypoints.mcp.server import build_server
from taskgate.infrastructure.system import SystemClock
from tests.conftest import Services


def app_of(
    services: Services,
    workflows: WorkflowEngine | None = None,
    agents: AgentService | None = None,
    writebacks: WritebackService | None = None,
) -> App:
    """The App over `services`; `workflows` and `agents` (see tests/workflow_support.py `rig`) when a test
    needs the workflow runtime."""
    return App(
        None,
        services.sessions,
        services.tracker,
        services.audit,
        services.access,
        services.workspaces,
        services.context,
        services.operators,
        services.decisions,
        services.review_queue,
        outputs=services.outputs,
        workflows=workflows,
        agents=agents,
        writebacks=writebacks or WritebackService(services.uow, SystemClock(), None),
    )


@dataclass
class ToolCaller:
    """Calls tools and splits the result into (ok, structured content or error text)."""

    client: Client

    async def call(self, tool: str, **arguments: Any) -> tuple[bool, Any]:
        result = await self.client.call_tool(tool, arguments)
        if result.is_error:
            return False, result.content[0].text
        return True, result.structured_content

    async def ok(self, tool: str, **arguments: Any) -> Any:
        ok, out = await self.call(tool, **arguments)
        assert ok, f"{tool} failed: {out}"
        return out

    async def refused(self, tool: str, **arguments: Any) -> str:
        ok, out = await self.call(tool, **arguments)
        assert not ok, f"{tool} should have been refused: {out}"
        assert "Traceback" not in out and 'File "' not in out
        return out


@asynccontextmanager
async def connect(
    services: Services, principal: Principal | None, *, app: App | None = None, **options: Any
) -> AsyncIterator[ToolCaller]:
    """The taskgate MCP server for `services` (or for `app`, e.g. one carrying a workflow engine), with
    `principal` as the caller, and a client connected to it."""

    @asynccontextmanager
    async def open_app() -> AsyncIterator[App]:
        yield app or app_of(services)

    server = build_server(open_app, local_principal=principal, **options)
    async with Client(server) as client:
        yield ToolCaller(client)
