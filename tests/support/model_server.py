"""A scripted, offline model server that the real agent CLIs talk to in end-to-end tests.

It speaks just enough of two wire formats:

* Anthropic Messages, `POST /v1/messages` (Claude Code), streaming SSE or plain JSON, plus
  `POST /v1/messages/count_tokens`;
* OpenAI Responses, `POST /v1/responses` (Codex), streaming SSE: plain function tools (`tools`), or Codex's
  "code mode" (what its default model gets: no `tools`, an `additional_tools` input item whose custom `exec` tool
  runs JavaScript that calls the nested tools, `await tools.exec_command({cmd})`), answered with a
  `custom_tool_call` of `exec` holding the step's call as JavaScript;
* OpenAI Chat Completions, `POST /v1/chat/completions` (aider through litellm): a file edit in the edit format
  aider's system prompt asks for (a SEARCH/REPLACE block, its default "diff" format, or the whole file), or a
  commit message when asked for one.

The script is stateless: each request carrying tools is answered from the number of tool results
already in its conversation.

1. a shell call writing hello.txt (`printf hello > hello.txt`);
2. a shell call committing it (`git add hello.txt && git commit -m "feat: hello"`);
3. a call of the MCP tool whose name ends with `save_output`;
4. the final text "done" (or the `final_text` it is given).

Requests without tools (titles, quota probes) get a short text. Every call reports 100 input and
20 output tokens; with `measure=True` its input tokens are the request body's size instead (its JSON's characters
/ 4, about what a tokenizer makes of English and code), so a run that sends more context is charged more (the
resume benchmark compares runs by it). Each model request's entry in `requests` has the `input_tokens` reported.
Other scripts: "error500" and "error429" answer every model call with that status,
"hang" accepts the request and never answers (until the server stops).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SCRIPTS = ("ok", "ask", "error500", "error429", "hang")
INPUT_TOKENS = 100
OUTPUT_TOKENS = 20
FINAL_TEXT = "done"
WRITE_COMMAND = "printf hello > hello.txt"
COMMIT_COMMAND = 'git add hello.txt && git commit -m "feat: hello"'
SAVE_ARGUMENTS = {"name": "notes.md", "content": "hello from the model"}
MODEL_PATHS = ("/v1/messages", "/v1/responses", "/v1/chat/completions")
CHARS_PER_TOKEN = 4  # `measure`: a request's input tokens are its body's JSON length over this
# aider's "whole" edit format: the file's name, then its whole content fenced; aider writes it and commits
WHOLE_EDIT = "I will create hello.txt.\n\nhello.txt\n```\nhello\n```\n"
# aider's "diff" edit format (its default for gpt-4o): a SEARCH/REPLACE block with an empty SEARCH creates the file
DIFF_EDIT = "I will create hello.txt.\n\nhello.txt\n```\n<<<<<<< SEARCH\n=======\nhello\n>>>>>>> REPLACE\n```\n"
COMMIT_MESSAGE = "feat: hello"
# the "ask" script: a shell command the preset does not allow outright (a permission prompt), a commit, then a
# question to the operator through the MCP tool whose name ends with `ask_operator`
ASK_WRITE = "python3 -c \"open('asked.txt', 'w').write('asked')\""
ASK_COMMIT = 'git add asked.txt && git commit -m "feat: asked"'
ASK_ARGUMENTS = {"question": "Which colour should the button be?", "choices": ["red", "blue"]}


class ModelServer:
    """`with ModelServer("ok") as server:` serves on `server.url` and records `server.requests`."""

    def __init__(self, script: str = "ok", final_text: str = FINAL_TEXT, *, measure: bool = False) -> None:
        """`final_text`: what the model says last (after its tool calls), e.g. a many-line plan. `measure`: report
        input tokens proportional to each request's size, not a fixed 100."""
        if script not in SCRIPTS:
            raise ValueError(f"unknown script {script!r}; one of {SCRIPTS}")
        self.script = script
        self.final_text = final_text
        self.measure = measure
        self.requests: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ModelServer:
        handler = type("Handler", (_Handler,), {"model": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="model-server", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def next_id(self, prefix: str) -> str:
        with self._lock:
            return f"{prefix}_{next(self._ids):04d}"

    def record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(entry)

    def model_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"] in MODEL_PATHS]

    def input_tokens(self, body: dict[str, Any]) -> int:
        """What a call with this body reports as its input tokens (see `measure`)."""
        if not self.measure:
            return INPUT_TOKENS
        return max(1, len(json.dumps(body, separators=(",", ":"))) // CHARS_PER_TOKEN)


# --- the script ---------------------------------------------------------------------------------


def _tool_names(tools: list[dict[str, Any]]) -> list[str]:
    """Callable tool names; a Responses `namespace` tool (how Codex groups an MCP server's tools) gives
    `<namespace>.<tool>` for each of its tools."""
    names = []
    for tool in tools:
        if tool.get("defer_loading"):
            continue
        name = tool.get("name") or (tool.get("function") or {}).get("name")
        if tool.get("type") == "namespace":
            names.extend(f"{name}.{inner.get('name')}" for inner in tool.get("tools") or [])
        elif name:
            names.append(name)
    return names


def code_mode_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The nested tools of Codex's code mode, as plain tools (name and the argument names of its declaration), when
    the request offers the custom `exec` tool in an `additional_tools` item; None otherwise."""
    for item in body.get("input") or []:
        if not isinstance(item, dict) or item.get("type") != "additional_tools":
            continue
        for group in item.get("tools") or []:
            for tool in group.get("tools") or []:
                if tool.get("type") == "custom" and tool.get("name") == "exec":
                    return _declared(str(tool.get("description") or ""))
    return None


def _declared(description: str) -> list[dict[str, Any]]:
    """`declare const tools: { NAME(args: { a: …; b?: … }` blocks of the exec tool's description, as tools."""
    tools = []
    for found in re.finditer(r"declare const tools: \{ (\w+)\((?:args: \{(.*?)\}\))?", description, re.S):
        names = re.findall(r"^\s*(\w+)\??:", found.group(2) or "", re.M)
        tools.append({"name": found.group(1), "input_schema": {"properties": {key: {} for key in names}}})
    return tools


def javascript(call: tuple[str, dict[str, Any]]) -> str:
    """The step's tool call as code mode's JavaScript: the nested tool awaited, its result given back as text."""
    name, arguments = call
    return (f"const result = await tools.{name}({json.dumps(arguments)});\n"
            "text(typeof result === 'string' ? result : JSON.stringify(result));")  # fmt: skip


def save_any_javascript() -> str:
    """Code mode's step 3: Codex defers MCP tools (they are on `tools` and in `ALL_TOOLS`, not in the exec tool's
    description), so the script looks the save_output tool up as a model would, and names the file by the argument
    its declaration has (`path` for taskgate's tool, `name` for the test peer's)."""
    arguments = json.dumps(SAVE_ARGUMENTS["content"])
    return (
        "const tool = ALL_TOOLS.find((t) => t.name.endsWith('save_output'));\n"
        "if (!tool) { text('no save_output tool'); exit(); }\n"
        f"const args = {{content: {arguments}}};\n"
        f"args[/\\bpath\\b/.test(tool.description) ? 'path' : 'name'] = {json.dumps(SAVE_ARGUMENTS['name'])};\n"
        "const result = await tools[tool.name](args);\n"
        "text(typeof result === 'string' ? result : JSON.stringify(result));"
    )


def ask_any_javascript() -> str:
    """Code mode's "ask" step: the MCP tool whose name ends with `ask_operator` looked up as a model would (Codex
    defers MCP tools), called with ASK_ARGUMENTS, its result given back as text."""
    return (
        "const tool = ALL_TOOLS.find((t) => t.name.endsWith('ask_operator'));\n"
        "if (!tool) { text('no ask_operator tool'); exit(); }\n"
        f"const result = await tools[tool.name]({json.dumps(ASK_ARGUMENTS)});\n"
        "text(typeof result === 'string' ? result : JSON.stringify(result));"
    )


def save_arguments(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """SAVE_ARGUMENTS as the tool's own schema names them: taskgate's save_output takes `path`, the test peer's
    `name` (a model reads the schema the same way)."""
    properties: dict[str, Any] = {}
    for tool in tools:
        inner = tool.get("tools") if tool.get("type") == "namespace" else [tool]
        for each in inner or []:
            if name.endswith(str(each.get("name") or (each.get("function") or {}).get("name"))):
                schema = each.get("input_schema") or each.get("parameters") or {}
                properties = schema.get("properties") or {}
    arguments = dict(SAVE_ARGUMENTS)
    if "path" in properties and "name" not in properties:
        arguments["path"] = arguments.pop("name")
    return arguments


def working_directory(body: dict[str, Any]) -> str | None:
    """The working directory Claude Code states in its system prompt ("Working directory: /path"), if any."""
    found = re.search(r"Working directory: (/[^\s\\\"]+)", json.dumps(body.get("system") or ""))
    return found.group(1) if found else None


def anthropic_tool_results(body: dict[str, Any]) -> int:
    count = 0
    for message in body.get("messages") or []:
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, list):
            count += sum(1 for block in content if isinstance(block, dict) and block.get("type") == "tool_result")
    return count


def responses_tool_results(body: dict[str, Any]) -> int:
    items = body.get("input")
    if not isinstance(items, list):
        return 0
    return sum(1 for item in items if isinstance(item, dict) and str(item.get("type", "")).endswith("call_output"))


def plan(step: int, tools: list[dict[str, Any]], cwd: str | None = None) -> tuple[str, dict[str, Any]] | None:
    """The tool call for this step as (tool name, arguments), or None for the final text. With Claude Code's
    `Write` tool and its working directory known (from its system prompt), the file is written with `Write`, as a
    model would, so an agent allowed only `Bash(git:*)` besides its edit tools can still do the work."""
    names = _tool_names(tools)
    if step == 0 and cwd and "Write" in names:
        return "Write", {"file_path": f"{cwd.rstrip('/')}/hello.txt", "content": "hello"}
    if step in (0, 1):
        command = WRITE_COMMAND if step == 0 else COMMIT_COMMAND
        return _shell_call(names, tools, command)
    if step == 2:
        for name in names:
            if name.endswith("save_output"):  # Claude: mcp__taskgate__save_output; Codex: mcp__taskgate.save_output
                return name, save_arguments(tools, name)
        return None
    return None


def ask_plan(step: int, tools: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """The "ask" script's tool call for this step: write (a permission prompt), commit, ask the operator; then the
    final text."""
    names = _tool_names(tools)
    if step in (0, 1):
        return _shell_call(names, tools, ASK_WRITE if step == 0 else ASK_COMMIT)
    if step == 2:
        return next(((name, dict(ASK_ARGUMENTS)) for name in names if name.endswith("ask_operator")), None)
    return None


def _shell_call(names: list[str], tools: list[dict[str, Any]], command: str) -> tuple[str, dict[str, Any]] | None:
    if "Bash" in names:
        return "Bash", {"command": command, "description": "run a shell command"}
    if "exec_command" in names:
        return "exec_command", {"cmd": command}
    for name in ("shell", "container.exec", "local_shell"):
        if name in names:
            return name, {"command": ["bash", "-lc", command]}
    if "shell_command" in names:
        return "shell_command", {"command": command}
    return None


# --- HTTP ---------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    model: ModelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {"_raw": raw.decode("utf-8", "replace")}
        return parsed if isinstance(parsed, dict) else {"_json": parsed}

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        self.model.record({"method": "GET", "path": path, "body": None, "headers": dict(self.headers)})
        if path.endswith("/models"):
            self._json(200, {"object": "list", "data": [], "models": []})
        else:
            self._json(200, {})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        body = self._body()
        tokens = self.model.input_tokens(body)
        self.model.record({"method": "POST", "path": path, "body": body, "headers": dict(self.headers),
                           "input_tokens": tokens})  # fmt: skip
        if path == "/v1/messages/count_tokens":
            self._json(200, {"input_tokens": INPUT_TOKENS})
            return
        if path not in MODEL_PATHS:
            self._json(200, {})
            return
        anthropic = path == "/v1/messages"
        chat = path == "/v1/chat/completions"
        script = self.model.script
        if script == "hang":
            self.model.stopping.wait()
            return
        if script in ("error500", "error429"):
            status = 500 if script == "error500" else 429
            self._error(status, anthropic)
            return
        if chat:
            self._chat(body)
            return
        coded = None if anthropic or body.get("tools") else code_mode_tools(body)
        if coded is not None:  # Codex's code mode: each step a script for its `exec` tool
            step = responses_tool_results(body)
            if self.model.script == "ask":
                call = ask_plan(step, coded)
                script = ask_any_javascript() if step == 2 else (javascript(call) if call else None)
            else:
                call = plan(step, coded)
                script = save_any_javascript() if step == 2 else (javascript(call) if call else None)
            self._responses(body, None, self.model.final_text, script=script)
            return
        tools = body.get("tools") or []
        if not tools:
            call = None
            text = "Hello"
        else:
            step = anthropic_tool_results(body) if anthropic else responses_tool_results(body)
            if script == "ask":
                call = ask_plan(step, tools)
            else:
                call = plan(step, tools, working_directory(body) if anthropic else None)
            text = self.model.final_text
        if anthropic:
            self._anthropic(body, call, text)
        else:
            self._responses(body, call, text)

    # --- plumbing

    def _chat(self, body: dict[str, Any]) -> None:
        """Chat Completions (aider): the file edit in the format its system prompt asks for, or a commit message
        when asked for one."""
        messages = body.get("messages") or []
        asked = json.dumps(messages).lower()
        system = json.dumps([m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "system"])
        edit = DIFF_EDIT if "SEARCH/REPLACE" in system else WHOLE_EDIT
        text = COMMIT_MESSAGE if "commit message" in asked else edit
        message = {"role": "assistant", "content": text}
        usage = {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
                 "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}  # fmt: skip
        reply = {"id": self.model.next_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
                 "model": body.get("model") or "gpt-4o", "usage": usage,
                 "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip
        if body.get("stream"):
            chunk = {**reply, "object": "chat.completion.chunk",
                     "choices": [{"index": 0, "delta": message, "finish_reason": "stop"}]}  # fmt: skip
            data = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self._json(200, reply)

    def _json(self, status: int, payload: dict[str, Any], extra: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, anthropic: bool) -> None:
        extra = {"retry-after": "0"} if status == 429 else {}
        if anthropic:
            kind = "rate_limit_error" if status == 429 else "api_error"
            payload: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": f"scripted {status}"}}
        else:
            kind = "rate_limit_exceeded" if status == 429 else "server_error"
            payload = {"error": {"message": f"scripted {status}", "type": kind, "code": kind}}
        self._json(status, payload, extra)

    def _sse(self, events: Iterator[tuple[str, dict[str, Any]]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for name, data in events:
            self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()
        self.close_connection = True

    # --- Anthropic Messages

    def _anthropic(self, body: dict[str, Any], call: tuple[str, dict[str, Any]] | None, text: str) -> None:
        model = body.get("model") or "claude-test"
        message_id = self.model.next_id("msg")
        if call is None:
            content = [{"type": "text", "text": text}]
            stop = "end_turn"
        else:
            content = [{"type": "tool_use", "id": self.model.next_id("toolu"), "name": call[0], "input": call[1]}]
            stop = "tool_use"
        usage = {
            "input_tokens": self.model.input_tokens(body),
            "output_tokens": OUTPUT_TOKENS,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        if not body.get("stream"):
            self._json(
                200,
                {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": content,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": usage,
                },
            )
            return
        self._sse(_anthropic_events(message_id, model, content, stop, usage))

    # --- OpenAI Responses

    def _responses(
        self, body: dict[str, Any], call: tuple[str, dict[str, Any]] | None, text: str, *, script: str | None = None
    ) -> None:
        response_id = self.model.next_id("resp")
        if script is not None:  # code mode: JavaScript for the custom `exec` tool
            item: dict[str, Any] = {"type": "custom_tool_call", "id": self.model.next_id("ctc"),
                                    "call_id": self.model.next_id("call"), "name": "exec", "input": script,
                                    "status": "completed"}  # fmt: skip
        elif call is None:
            item = {
                "type": "message",
                "id": self.model.next_id("msg"),
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        else:
            namespace, _, name = call[0].rpartition(".")
            item = {
                "type": "function_call",
                "id": self.model.next_id("fc"),
                "call_id": self.model.next_id("call"),
                "name": name,
                "arguments": json.dumps(call[1]),
                "status": "completed",
            }
            if namespace:
                item["namespace"] = namespace
        self._sse(_responses_events(response_id, body.get("model") or "gpt-test", item, self.model.input_tokens(body)))


def _anthropic_events(
    message_id: str, model: str, content: list[dict[str, Any]], stop: str, usage: dict[str, int]
) -> Iterator[tuple[str, dict[str, Any]]]:
    start_usage = dict(usage, output_tokens=1)
    yield (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": start_usage,
            },
        },
    )
    for index, block in enumerate(content):
        if block["type"] == "text":
            yield (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
            )
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            yield ("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield ("content_block_stop", {"type": "content_block_stop", "index": index})
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
    )
    yield ("message_stop", {"type": "message_stop"})


def _responses_events(
    response_id: str, model: str, item: dict[str, Any], input_tokens: int = INPUT_TOKENS
) -> Iterator[tuple[str, dict[str, Any]]]:
    base = {"id": response_id, "object": "response", "model": model, "output": []}
    yield "response.created", {"type": "response.created", "response": dict(base, status="in_progress")}
    yield (
        "response.output_item.added",
        {"type": "response.output_item.added", "output_index": 0, "item": dict(item, status="in_progress")},
    )
    if item["type"] == "message":
        text = item["content"][0]["text"]
        yield (
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "item_id": item["id"],
                "output_index": 0,
                "content_index": 0,
                "delta": text,
            },
        )
    yield "response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}
    usage = {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": OUTPUT_TOKENS,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + OUTPUT_TOKENS,
    }
    yield (
        "response.completed",
        {"type": "response.completed", "response": dict(base, status="completed", output=[item], usage=usage)},
    )
