"""A look at a pull request (domain/forge.py `Observation`) as plain data for its row, and back."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from taskgate.domain.forge import CheckRun, LineComment, Observation, PullRequest, Review


def encode_observation(seen: Observation) -> dict[str, Any]:
    """`seen` as JSON-able data (what `pull_requests.observation` stores)."""
    return asdict(seen)


def decode_observation(data: dict[str, Any]) -> Observation:
    """The Observation `encode_observation` stored."""
    return Observation(
        pull=PullRequest(**data["pull"]),
        checks=tuple(CheckRun(**c) for c in data.get("checks", ())),
        reviews=tuple(Review(**r) for r in data.get("reviews", ())),
        comments=tuple(LineComment(**c) for c in data.get("comments", ())),
    )
