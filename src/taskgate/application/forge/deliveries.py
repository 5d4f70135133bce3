"""Webhook deliveries from the forge (`POST /forge/webhook` on `serve --http`): verified, deduplicated, and turned
into a look at the pull request they are about.

A delivery is accepted only when its `X-Hub-Signature-256` is the HMAC-SHA256 of the raw body under a configured
secret (compared in constant time); an unsigned, wrongly signed or unconfigured delivery is refused with 401 and
counted. GitHub signs no timestamp, so a replay is recognised by its `X-GitHub-Delivery` id: the first delivery of
an id is recorded under it (the primary key decides, across nodes), a second is answered 200 and ignored, counted.

What a delivery says is not trusted as a fact: it only *pokes* the pull request's row, and the forge loop reads the
pull request from the API (domain/forge.py decides from that). A forged payload that passed the signature could at
most cause a look.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taskgate.application.forge.follower import ForgeFollower
from taskgate.application.forge.ports import ForgeDirectory
from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.domain.forge import signature_valid

_EVENTS = frozenset({"pull_request", "pull_request_review", "pull_request_review_comment", "check_run",
                     "check_suite", "status", "push", "ping"})  # fmt: skip


@dataclass(frozen=True, slots=True)
class DeliveryAnswer:
    """What the endpoint answers: an HTTP status and a short text."""

    status: int
    text: str


class ForgeDeliveries:
    """Receive a webhook delivery: verify, deduplicate, poke the pull request, wake the forge loop."""

    def __init__(self, uow: UnitOfWorkFactory, forges: ForgeDirectory, follower: ForgeFollower, clock: Clock) -> None:
        self._uow, self._forges, self._follower, self._clock = uow, forges, follower, clock

    async def receive(self, headers: Mapping[str, str], body: bytes) -> DeliveryAnswer:
        """Handle one delivery (`headers` with lower-case names)."""
        event = headers.get("x-github-event", "")[:100] or "?"
        secrets = self._forges.webhook_secrets()
        if not any(signature_valid(s, body, headers.get("x-hub-signature-256")) for s in secrets):
            await self._record(f"refused-{uuid.uuid4()}", event, "refused")
            why = "no webhook secret is configured" if not secrets else "the signature does not match"
            return DeliveryAnswer(401, f"refused: {why}")
        delivery = headers.get("x-github-delivery", "")
        if not delivery or len(delivery) > 80:
            await self._record(f"refused-{uuid.uuid4()}", event, "refused")
            return DeliveryAnswer(400, "refused: no X-GitHub-Delivery id")
        try:
            payload = json.loads(body)
        except ValueError:
            await self._record(f"refused-{uuid.uuid4()}", event, "refused")
            return DeliveryAnswer(400, "refused: the body is not JSON")
        if not await self._record(delivery, event, "accepted"):
            await self._record(f"replay-{uuid.uuid4()}", event, "replay")
            return DeliveryAnswer(200, f"ignored: delivery {delivery} was received before")
        if event not in _EVENTS:
            return DeliveryAnswer(202, f"accepted: {event} is not an event taskgate follows")
        branch, number = about(payload)
        async with self._uow(write=True) as uow:
            poked = await uow.pull_requests.poke(branch, number)
            await uow.commit()
        if poked:
            self._follower.wake()
        return DeliveryAnswer(202, f"accepted: {poked} pull request(s) to look at")

    async def _record(self, delivery: str, event: str, outcome: str) -> bool:
        async with self._uow(write=True) as uow:
            fresh = await uow.pull_requests.record_delivery(delivery, event, outcome, self._clock.now())
            await uow.commit()
        return fresh

    async def counts(self) -> dict[str, int]:
        """Deliveries by outcome: accepted, refused, replay."""
        async with self._uow(write=False) as uow:
            return await uow.pull_requests.delivery_counts()


def about(payload: Any) -> tuple[str | None, int | None]:
    """The branch and pull request number a delivery is about (its pull request, a check's first pull request,
    or a check suite's head branch), None where it names none."""
    if not isinstance(payload, dict):
        return None, None
    pull = payload.get("pull_request")
    if isinstance(pull, dict):
        return _ref(pull.get("head")), _int(pull.get("number"))
    for key in ("check_run", "check_suite"):
        item = payload.get(key)
        if isinstance(item, dict):
            pulls = item.get("pull_requests") or []
            first = pulls[0] if pulls and isinstance(pulls[0], dict) else {}
            suite = item.get("check_suite") if isinstance(item.get("check_suite"), dict) else item
            return _ref(first.get("head")) or suite.get("head_branch"), _int(first.get("number"))
    return None, _int(payload.get("number"))


def _ref(head: Any) -> str | None:
    return str(head["ref"]) if isinstance(head, dict) and head.get("ref") else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
