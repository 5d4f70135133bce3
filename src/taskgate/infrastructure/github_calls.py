"""What the forge (infrastructure/forge/github.py) and the GitHub Issues tracker (infrastructure/trackers/
github_issues.py) share about calling GitHub through githubkit: the retry policy, and a failure in words that say
what to check and never show the token (only the name of its variable)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from githubkit import GitHub
from githubkit.exception import RateLimitExceeded, RequestFailed
from githubkit.retry import RetryChainDecision, RetryRateLimit, RetryServerError

# Rate limits: wait out the reset (or Retry-After) up to three times; server errors: three retries, 1 s, 4 s, 9 s.
RETRY = RetryChainDecision(RetryRateLimit(max_retry=3), RetryServerError(max_retry=3))


class PooledGitHub(GitHub):
    """githubkit's client keeping one HTTP client per event loop. Used outside `async with`, githubkit builds (and
    closes) a new httpx client for every request, which loads the CA bundle each time: measured at 0.14 s a request
    on this machine kind, 8.4 s of a 15 s poll of 1,000 issues (benchmarks/tracker_dispatch.py). `async with` would
    keep one, but githubkit holds it in a context variable, which the tasks of `serve` (the sweeper, MCP calls,
    the forge follower) do not share. One client per loop is shared by every task of that loop, and a CLI command's
    loop gets its own; a loop's client is dropped with the loop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pooled: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    @asynccontextmanager
    async def get_async_client(self) -> AsyncGenerator[httpx.AsyncClient, None]:
        loop = asyncio.get_running_loop()
        client = self._pooled.get(loop)
        if client is None or client.is_closed:
            client = await self._create_async_client()
            self._pooled[loop] = client
        yield client


def failure(what: str, exc: Exception, *, repository: str, api_url: str, token_env: str) -> str:
    """`what` failed, and why: the rate limit, a refused token (named by its variable), a repository the token cannot
    see, GitHub's own message for another status, or no answer."""
    where = f"{repository} at {api_url}"
    if isinstance(exc, RateLimitExceeded):
        return f"{what}: GitHub's rate limit is spent for the token in ${token_env} (retried; try later)"
    if isinstance(exc, RequestFailed):
        status, said = exc.response.status_code, github_message(exc)
        if status == 401:
            return f"{what}: the token in ${token_env} was refused by {api_url} (401 {said})"
        if status == 404:
            return f"{what}: {where} not found, or the token in ${token_env} cannot see it (404)"
        return f"{what}: {where} answered {status} {said}".rstrip()
    return f"{what}: {where} did not answer ({type(exc).__name__})"


def github_message(exc: RequestFailed) -> str:
    """GitHub's `message` from an error answer (at most 300 characters), or "" for a body that is not JSON."""
    try:
        return str(exc.response.json().get("message", ""))[:300]
    except Exception:  # a body that is not JSON: the status says enough
        return ""
