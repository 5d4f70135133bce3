"""One reason a policy objects (a Violation) and how much it counts (its Severity): what a refusal carries, and all that
errors.py needs of policies."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class Violation:
    """One reason a policy objects, with what the caller can do about it."""

    policy: str
    message: str
    severity: Severity = Severity.ERROR
    suggestion: str = ""

    def describe(self) -> str:
        tail = f" (suggestion: {self.suggestion})" if self.suggestion else ""
        return f"{self.policy}: {self.message}{tail}"

    def as_dict(self) -> dict[str, str]:
        return {
            "policy": self.policy,
            "message": self.message,
            "severity": self.severity.value,
            "suggestion": self.suggestion,
        }
