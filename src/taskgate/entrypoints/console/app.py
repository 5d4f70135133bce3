"""The operator console as an ASGI app, and its place beside /mcp on the same port.

`serve --http` (and `taskgate console`) serve `beside_mcp(mcp, console)`: requests under /mcp (and the lifespan,
which opens the services) go to the MCP app behind its bearer gate; everything else to the console, which finds the
open services through `runtime_app`. Static assets are package data; nothing is fetched from elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from taskgate.bootstrap import App
from taskgate.domain.errors import TaskgateError
from taskgate.entrypoints.console import actions, pages
from taskgate.entrypoints.console.diff_view import highlight_css
from taskgate.entrypoints.console.live import stream
from taskgate.entrypoints.console.signins import COOKIE
from taskgate.entrypoints.console.web import SECURITY_HEADERS, Console, visit
from taskgate.entrypoints.mcp.server import oauth_path

_STATIC_TYPES = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}


def console_app(runtime_app: Callable[[], App | None]) -> tuple[Starlette, Console]:
    """The console's routes over the services `runtime_app` returns (None while the server starts)."""
    console = Console(runtime_app)
    routes = [Route(path, endpoint, methods=["GET"]) for path, endpoint in pages.routes(console).items()]
    for path, endpoint in actions.routes(console).items():
        methods = {"/signin": ["GET", "POST"], "/signin/link": ["GET"]}.get(path, ["POST"])
        routes.append(Route(path, endpoint, methods=methods))
    routes += [Route("/events", _events(console)), Route("/static/{name}", _static)]
    routes.append(Route("/forge/webhook", _forge_webhook(runtime_app), methods=["POST"]))
    return Starlette(routes=routes), console


def beside_mcp(mcp: Any, console: Starlette) -> Any:
    """One ASGI app: /mcp, the OAuth discovery paths (its gate answers them 404: taskgate takes bearer tokens, not
    OAuth) and the lifespan to `mcp`, the rest to `console`."""

    async def dispatch(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "lifespan" or path.startswith("/mcp") or oauth_path(path):
            await mcp(scope, receive, send)
        else:
            await console(scope, receive, send)

    return dispatch


def _forge_webhook(runtime_app: Callable[[], App | None]) -> Callable[[Request], Any]:
    """`POST /forge/webhook`: a forge's delivery (application/forge/deliveries.py). No session cookie or token: the
    delivery's HMAC signature is its authentication. 404 when no project has a forge."""

    async def receive(request: Request) -> Response:
        app = runtime_app()
        if app is None or app.forge_deliveries is None:
            return PlainTextResponse("no forge is configured", status_code=404)
        body = await request.body()
        answer = await app.forge_deliveries.receive({k.lower(): v for k, v in request.headers.items()}, body)
        return PlainTextResponse(answer.text, status_code=answer.status)

    return receive


def _events(console: Console) -> Callable[[Request], Any]:
    async def events(request: Request) -> Response:
        try:
            await visit(console, request)
        except TaskgateError:
            return Response("sign in first", status_code=401, headers=SECURITY_HEADERS)
        since = request.query_params.get("since", "")
        mark = int(since) if since.isdigit() and len(since) < 19 else await console.feed.current()
        cookie = request.cookies.get(COOKIE)

        async def alive() -> bool:
            return not await request.is_disconnected() and console.sign_ins.find(cookie) is not None

        headers = {**SECURITY_HEADERS, "x-accel-buffering": "no"}
        return StreamingResponse(stream(console.feed, mark, alive), media_type="text/event-stream", headers=headers)

    return events


async def _static(request: Request) -> Response:
    name = request.path_params["name"]
    if name == "highlight.css":
        return Response(highlight_css(), media_type="text/css", headers=_cached())
    kind = next((t for ext, t in _STATIC_TYPES.items() if name.endswith(ext)), None)
    folder = resources.files("taskgate.entrypoints.console") / "static"
    if kind is None or "/" in name or name.startswith(".") or not (folder / name).is_file():
        return Response("not found", status_code=404, headers=SECURITY_HEADERS)
    return Response((folder / name).read_bytes(), media_type=kind, headers=_cached())


def _cached() -> dict[str, str]:
    return {**SECURITY_HEADERS, "cache-control": "max-age=300"}
