"""Shared helpers of the scripted example agents (stdlib only; copy this file along with an agent).

An agent started by taskgate gets, in its environment: TASKGATE_SESSION_ID, TASKGATE_TASK_ID,
TASKGATE_SESSION_FOLDER (where its outputs go), TASKGATE_MCP_URL and TASKGATE_TOKEN (a bearer token scoped
to its own session) and TASKGATE_AGENT_ID. Its working directory is the session's git worktree.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

AGENT = os.environ.get("TASKGATE_AGENT_ID") or Path(sys.argv[0]).stem
SESSION = os.environ.get("TASKGATE_SESSION_ID", "")
FOLDER = os.environ.get("TASKGATE_SESSION_FOLDER", "")


def say(message: str) -> None:
    """One progress line on stdout (taskgate keeps the tail of it in the agent's record and log)."""
    print(f"[{Path(sys.argv[0]).stem}] {message}", flush=True)


def heartbeat() -> None:
    """Touch `<session folder>/heartbeat-<agent id>`: a sign of life anyone can read from the file's mtime."""
    if FOLDER and Path(FOLDER).is_dir():
        (Path(FOLDER) / f"heartbeat-{AGENT}").touch()


def slug(text: str, fallback: str = "task") -> str:
    words = re.findall(r"[a-z0-9]+", text.lower())[:6]
    return "-".join(words) or fallback


def save_output(path: str, content: str) -> str:
    """Save `content` as `path` in the session folder: through taskgate's `save_output` MCP tool when
    TASKGATE_MCP_URL and TASKGATE_TOKEN are set and the server answers (the file is then listed in the
    manifest), else straight into TASKGATE_SESSION_FOLDER: also when the server refuses, is not there, or dies
    in the middle of its reply. Returns how it was saved."""
    if os.environ.get("TASKGATE_MCP_URL") and os.environ.get("TASKGATE_TOKEN"):
        try:
            McpClient(os.environ["TASKGATE_MCP_URL"], os.environ["TASKGATE_TOKEN"]).call(
                "save_output", {"session_id": SESSION, "path": path, "content": content}
            )
            return "mcp"
        except (OSError, ValueError, RuntimeError) as exc:
            say(f"save_output over MCP failed ({exc}); writing into the session folder instead")
    if not FOLDER:
        say(f"no TASKGATE_SESSION_FOLDER: {path} not saved")
        return "none"
    target = Path(FOLDER, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    return "file"


class McpClient:
    """The smallest MCP client over streamable HTTP: initialize, then one tools/call per `call`."""

    def __init__(self, url: str, token: str, timeout: float = 10.0) -> None:
        self.url, self.token, self.timeout, self.session = url, token, timeout, None
        self._id = 0

    def call(self, tool: str, arguments: dict) -> dict:
        """The tool's structured result.

        Raises: RuntimeError with the tool's error text; OSError when the server cannot be reached or its reply
        breaks off (ConnectionError: the server died mid-reply); ValueError for a reply that is not JSON."""
        if self.session is None:
            client = {"name": "taskgate-scripted-agent", "version": "1"}
            self._request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client})
            self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        result = self._request("tools/call", {"name": tool, "arguments": arguments})
        if result.get("isError"):
            raise RuntimeError(" ".join(c.get("text", "") for c in result.get("content", [])))
        return result.get("structuredContent") or {}

    def _request(self, method: str, params: dict) -> dict:
        self._id += 1
        reply = self._post({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params})
        if reply is None or "error" in reply:
            raise RuntimeError(f"{method}: {reply and reply['error']}")
        return reply["result"]

    def _post(self, message: dict) -> dict | None:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "Authorization": f"Bearer {self.token}"}  # fmt: skip
        if self.session:
            headers["Mcp-Session-Id"] = self.session
        request = urllib.request.Request(self.url, json.dumps(message).encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                self.session = response.headers.get("Mcp-Session-Id") or self.session
                body = response.read().decode()
        except http.client.HTTPException as exc:  # IncompleteRead, BadStatusLine...: not OSErrors, unlike a reset
            raise ConnectionError(f"the MCP server's reply was not a whole HTTP response: {exc!r}") from exc
        if not body.strip():
            return None
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            datas = [line[5:].strip() for line in body.splitlines() if line.startswith("data:")]
            replies = [json.loads(d) for d in datas if d]
            return next((r for r in replies if r.get("id") == message.get("id")), None)
        return json.loads(body)


def wait_a_little(seconds: float = 0.05) -> None:
    time.sleep(seconds)
