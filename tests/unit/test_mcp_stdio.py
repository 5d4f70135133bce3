"""The stdio transport's line handling (entrypoints/mcp/stdio.py), where a subprocess cannot easily reach: the
reply to a line that holds no message goes to the right id, a client's own error message still reaches the
server, and a reply that cannot be encoded becomes an error instead of ending the transport. The round trip
over a real `taskgate serve` is in tests/e2e/test_mcp_transports.py."""

from __future__ import annotations

import json

from mcp.shared.message import SessionMessage
from mcp_types import INTERNAL_ERROR, PARSE_ERROR, JSONRPCError, JSONRPCNotification, JSONRPCResponse

from taskgate.entrypoints.mcp.stdio import encode, read_line


def test_an_unreadable_request_is_answered_on_its_id_and_anything_else_on_null():
    request = read_line(rb'{"jsonrpc": "2.0", "id": "r-1", "method": "tools/call", "params": {"x": "\udcff"}}')
    response = read_line(rb'{"jsonrpc": "2.0", "id": 4, "result": {"x": "\udcff"}}')  # the client's, to us
    own_surrogate_id = read_line(rb'{"jsonrpc": "2.0", "id": "\udcff", "method": "ping"}')
    cut_short = read_line(b'{"jsonrpc": "2.0", "id": 9, "method": "pi')
    assert isinstance(request, JSONRPCError) and (request.id, request.error.code) == ("r-1", PARSE_ERROR)
    for refused in (response, own_surrogate_id, cut_short):
        assert isinstance(refused, JSONRPCError) and (refused.id, refused.error.code) == (None, PARSE_ERROR)


def test_a_client_error_message_and_a_notification_go_to_the_server_and_blank_lines_are_skipped():
    error = read_line(b'{"jsonrpc": "2.0", "id": 1, "error": {"code": -1, "message": "no"}}\n')
    notification = read_line(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\r\n')
    assert isinstance(error, SessionMessage) and isinstance(error.message, JSONRPCError)
    assert isinstance(notification, SessionMessage) and isinstance(notification.message, JSONRPCNotification)
    assert read_line(b"\n") is None and read_line(b"  \r\n") is None


def test_a_reply_that_cannot_be_encoded_becomes_an_internal_error_for_its_id():
    unsendable = SessionMessage(JSONRPCResponse(jsonrpc="2.0", id=7, result={"summary": "a\udcffb"}))
    line = encode(unsendable)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    answer = json.loads(line)
    assert (answer["id"], answer["error"]["code"]) == (7, INTERNAL_ERROR)
    assert "not valid Unicode" in answer["error"]["message"]
    log = JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"data": "\udcff"})
    assert encode(SessionMessage(log)) == b""  # nobody waits on a notification: dropped, with a warning
