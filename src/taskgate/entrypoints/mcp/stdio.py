"""MCP over stdin/stdout, where every line the client sends gets an answer.

Why not the SDK's `stdio_server` (mcp 2.3; upstream python-sdk issue #2751): a line it cannot parse (a lone
surrogate such as `"\\udcff"`, which pydantic's JSON parser refuses; anything that is not JSON) becomes an
exception on the read stream, which the server's dispatcher logs at DEBUG and drops. No reply is written, so
the client waits for ever on that request. It also decodes stdin with `errors="replace"`, so an invalid UTF-8
byte silently becomes U+FFFD in the caller's data. Over HTTP the SDK answers both with -32700. This transport
reads bytes and parses each line as the SDK's HTTP transport parses a request body, and answers what it cannot
read with the same errors, so both transports say the same:

- not UTF-8, or not JSON (a lone surrogate included): -32700, "Parse error: …";
- JSON, but not a JSON-RPC message: -32602, "Validation error: …".

The error carries the request's id when the line is readable enough to find one (Python's `json` reads lone
surrogates), so the caller waiting on that id is answered; otherwise its id is null, as JSON-RPC prescribes
for an id that cannot be found. A reply the SDK cannot encode (a lone surrogate in a result) is replaced by an
internal error for its id, where the SDK's writer would fail and end the transport. Otherwise it behaves as
the SDK's: the server reads and writes `SessionMessage`s, and fds 0 and 1 are taken off the wire while serving.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import BinaryIO

import anyio
import anyio.from_thread
import anyio.lowlevel
import pydantic_core
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    PARSE_ERROR,
    ErrorData,
    JSONRPCError,
    JSONRPCResponse,
    RequestId,
    jsonrpc_message_adapter,
)
from pydantic import ValidationError

_log = logging.getLogger("taskgate.mcp.stdio")


ServerStreams = tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]


Written = Callable[[SessionMessage], None]
"""Told of each message once its line is written (and flushed) to the client."""


async def serve_over_stdio(serve: Callable[[ServerStreams], Awaitable[None]], written: Written | None = None) -> None:
    """Run `serve` on the server's streams over this process's stdin and stdout until it returns; the replies it
    handed over are written by then. `written` is told of each message written."""
    with _claimed_stdio() as (wire_in, wire_out):
        async with stdio_transport(wire_in, wire_out, written) as streams:
            await serve(streams)


@asynccontextmanager
async def stdio_transport(
    wire_in: BinaryIO, wire_out: BinaryIO, written: Written | None = None
) -> AsyncIterator[ServerStreams]:
    """The server's streams over two byte streams, one JSON-RPC message per line each way. Lines that are not
    messages are answered here (module docstring) and never reach the server. `written` is told of each message
    once it is written."""
    read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](0)

    async def read(replies: MemoryObjectSendStream[SessionMessage]) -> None:
        async with read_send, replies:
            async for line in _lines(wire_in):
                message = read_line(line)
                if isinstance(message, JSONRPCError):  # not a message: answered here, the server never sees it
                    await replies.send(SessionMessage(message))
                elif message is not None:
                    await read_send.send(message)

    async def write() -> None:
        async with write_receive:
            async for message in write_receive:
                if line := encode(message):
                    await anyio.to_thread.run_sync(_send, wire_out, line)
                    if written is not None:
                        written(message)

    async with anyio.create_task_group() as writing:
        writing.start_soon(write)
        async with anyio.create_task_group() as reading:
            reading.start_soon(read, write_send.clone())
            try:
                yield read_receive, write_send
            finally:
                reading.cancel_scope.cancel()  # the server is done; a read still blocked is abandoned
                write_send.close()


async def _lines(wire_in: BinaryIO) -> AsyncIterator[bytes]:
    """The lines of `wire_in` until it ends, read by a daemon thread: serve may end while the client still holds
    stdin open (a start that failed, front.py), and a read blocked in a worker thread of anyio's would then keep
    the process from exiting. The thread hands over one line at a time, so the client is read no faster than
    served."""
    send, receive = anyio.create_memory_object_stream[bytes](0)
    token = anyio.lowlevel.current_token()

    def pump() -> None:
        try:
            while line := wire_in.readline():
                anyio.from_thread.run(send.send, line, token=token)
            anyio.from_thread.run_sync(send.close, token=token)
        except BaseException:  # nobody reads any more (the server, the loop are done), or the wire is gone
            return

    threading.Thread(target=pump, name="taskgate-stdin", daemon=True).start()
    async with receive:
        async for line in receive:
            yield line


def read_line(line: bytes) -> SessionMessage | JSONRPCError | None:
    """One line from the client: the message it holds for the server, the error to answer it with when it
    holds none, or None for a blank line."""
    if not line.strip():
        return None
    try:
        raw = pydantic_core.from_json(line)
    except ValueError as exc:
        return _error(_request_id(_lenient(line)), PARSE_ERROR, f"Parse error: {exc}")
    try:
        return SessionMessage(jsonrpc_message_adapter.validate_python(raw, by_name=False))
    except ValidationError as exc:
        return _error(_request_id(raw), INVALID_PARAMS, f"Validation error: {exc}")


def encode(message: SessionMessage) -> bytes:
    """`message` as one line of UTF-8 JSON. A reply that cannot be encoded becomes an internal error for its
    id; any other message that cannot is dropped (b""), with a warning: nobody waits on it."""
    try:
        return message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
    except pydantic_core.PydanticSerializationError as exc:
        answered = message.message
        if not isinstance(answered, JSONRPCResponse | JSONRPCError):
            _log.warning("a message to the client could not be encoded as JSON and was dropped: %s", exc)
            return b""
        _log.warning("the reply to request %r could not be encoded as JSON; an error is sent instead: %s",
                     answered.id, exc)  # fmt: skip
        text = "the reply holds text that is not valid Unicode (a lone surrogate) and cannot be sent as JSON"
        return encode(SessionMessage(_error(answered.id, INTERNAL_ERROR, text)))


def _error(ident: RequestId | None, code: int, message: str) -> JSONRPCError:
    return JSONRPCError(jsonrpc="2.0", id=ident, error=ErrorData(code=code, message=message))


def _lenient(line: bytes) -> object:
    """`line` as Python's `json` reads it (lone surrogates pass; invalid UTF-8 survives as surrogate escapes),
    or None when even that cannot."""
    try:
        return json.loads(line.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        return None


def _request_id(raw: object) -> RequestId | None:
    """The id of `raw` when it is a request (a notification or a response has none to answer), else None."""
    if not isinstance(raw, dict) or "method" not in raw:
        return None
    ident = raw.get("id")
    if isinstance(ident, int) and not isinstance(ident, bool):
        return ident
    if isinstance(ident, str) and ident.isprintable() and _encodable(ident):
        return ident
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate: an error carrying it could not be sent either
        return False
    return True


def _send(wire_out: BinaryIO, data: bytes) -> None:
    wire_out.write(data)
    wire_out.flush()


@contextmanager
def _claimed_stdio() -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """The wire as private duplicates of fds 0 and 1, as the SDK's stdio transport does: meanwhile fd 0 reads
    /dev/null and fd 1 writes to stderr, so child processes (git, agents, test runs) and stray prints never
    touch the wire. Both are restored after."""
    sys.stdout.flush()
    wire_in, wire_out = os.dup(0), os.dup(1)  # not inherited by children (PEP 446)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    try:
        # closefd=False: an abandoned read may still block on wire_in in its thread; it must not be closed and
        # reused under it (the process ends soon after anyway).
        with os.fdopen(wire_out, "wb", closefd=False) as out:
            yield os.fdopen(wire_in, "rb", closefd=False), out
    finally:
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)


def plain_logging() -> None:
    """WARNING and up, as plain lines on stderr (never on the wire). Without this the SDK's `MCPServer` installs
    rich's handler at INFO: every transition then renders two INFO lines of the `transitions` library (~1.4 ms
    each, on the event loop) and every crash a rich traceback (~2 s)."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
