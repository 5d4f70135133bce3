"""MCP tools for the audit log's proofs (docs/audit.md): its status (the newest checkpoint, the last verification),
a verification that names the first broken record, and a checkpoint signed on demand. The same `AuditLedger` use
cases as `taskgate audit status|verify|checkpoint` and the console's audit page."""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import datetime
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import BaseModel, Field

from taskgate.application.audit.ledger import AuditLedger, Scope, VerifyReport, checkpoint_summary
from taskgate.application.timestamps import parse_timestamp
from taskgate.domain.access import Capability
from taskgate.domain.errors import InvalidInput
from taskgate.entrypoints.mcp.calls import Call, call_of, tool_errors


class SignedCheckpoint(BaseModel):
    number: int
    at: str = Field(description="When it was signed: UTC ISO 8601.")
    reason: str = Field(description="interval, demand, prune or seal (the first, at start).")
    key: str = Field(description="The id of the key that signed it.")
    chains: int = Field(description="How many chains' heads it signed.")
    anchors: int = Field(description="How many pruned chains it anchors.")
    by: str = Field(default="system", description="Who asked for it (signed with it): an actor, or system.")


class LastVerification(BaseModel):
    at: str = Field(description="When it ran: UTC ISO 8601.")
    ok: bool
    checkpoint: int | None = Field(default=None, description="The newest checkpoint it checked against.")
    records: int = 0
    findings: int = Field(default=0, description="How many broken things it found.")
    scope: dict[str, Any] = Field(default_factory=dict, description="session and since; null: everything.")
    first: str | None = Field(default=None, description="The first broken thing, as it was named.")


class AuditStatusOut(BaseModel):
    summary: str
    key: str | None = Field(description="The id of the configured public key; null when there is none.")
    can_sign: bool = Field(description="Whether this server holds the private key (audit_checkpoint works).")
    key_error: str | None = Field(default=None, description="What is wrong with a key file that cannot be read.")
    checkpoints: int
    last_checkpoint: SignedCheckpoint | None
    chains: int
    records: int = Field(description="Records ever chained (pruned ones included).")
    unsigned_chains: int = Field(description="Chains holding records that no checkpoint covers yet.")
    unsigned_records: int = Field(default=0, description="Records that no checkpoint covers yet.")
    pending_records: int = Field(
        default=0, description="Records committed but not linked into their chain yet (the linker runs every second)."
    )
    last_verified: LastVerification | None

    @classmethod
    def of(cls, status: dict[str, Any]) -> AuditStatusOut:
        return cls.model_validate({**status, "summary": _status_line(status)})


class FindingOut(BaseModel):
    where: str = Field(description='The record ("transition_log 42"), checkpoint or chain.')
    chain: str | None
    seq: int | None
    problem: str


class VerifyOut(BaseModel):
    summary: str
    ok: bool
    scope: dict[str, Any]
    key: str = Field(description="The id of the public key the checkpoints were verified with.")
    records: int
    chains: int
    checkpoints: int
    unsigned_records: int = Field(description="Records written after the newest checkpoint: chained, not signed.")
    linked_now: int = Field(default=0, description="Records this verify linked first (committed, not linked yet).")
    last_checkpoint: SignedCheckpoint | None
    findings: list[FindingOut] = Field(description="In the order met, the first broken thing first (100 at most).")
    seconds: float


class CheckpointSignedOut(SignedCheckpoint):
    summary: str


@tool_errors
async def audit_status(ctx: Context) -> AuditStatusOut:
    """The audit log's proofs: the newest signed checkpoint (number, time, reason, key, chains covered), the last
    verification (when, ok or not, records, findings and the first one), how many chains hold records no checkpoint
    covers yet, and whether this server can sign. Reads only."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.AUDIT)
    return AuditStatusOut.of(await ledger_of(call).status())


@tool_errors
async def audit_verify(
    ctx: Context,
    session_id: Annotated[
        str | None, Field(description="Only this session's chain (id or prefix).", max_length=64)
    ] = None,
    since: Annotated[
        str | None,
        Field(
            description="Only records written since then: ISO 8601 with a timezone, e.g. 2026-11-21T10:00:00Z.",
            max_length=64,
        ),
    ] = None,
) -> VerifyOut:
    """Re-compute the audit chains (every one, or one session's) and check the checkpoints' signatures with the
    configured public key; names the first broken record (table and id, chain and seq, what differs). Appends an
    audit.verified event with the outcome, which audit_status shows."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.AUDIT)
    ledger, when = ledger_of(call), aware_time(since, "since")
    sid = await call.app.sessions.resolve_id(session_id) if session_id else None

    # A verify of a million records takes about half a minute: a client that asked for progress (a progressToken)
    # is told the records checked, every PROGRESS_EVERY (the SDK sends nothing to one that did not).
    def progress(done: int) -> Awaitable[None]:
        return ctx.report_progress(done, message=f"{done:,} records checked")

    report = await ledger.verify(Scope(sid, when), actor=call.principal.actor, progress=progress)
    return VerifyOut.model_validate({**report.as_dict(), "summary": _verify_line(report)})


@tool_errors
async def audit_checkpoint(ctx: Context) -> CheckpointSignedOut:
    """Sign a checkpoint now over the heads of every chain that grew since it was last signed (operators with
    write; the server needs the private key). Records written before it can no longer be removed unnoticed."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.SIGN_AUDIT)
    signed = checkpoint_summary(await ledger_of(call).checkpoint("demand", actor=call.principal.actor))
    assert signed is not None  # not only_if_grown: a checkpoint is always signed
    line = f"signed checkpoint #{signed['number']} over {signed['chains']} chain(s) with key {signed['key']}"
    return CheckpointSignedOut(summary=line, **signed)


def ledger_of(call: Call) -> AuditLedger:
    if call.app.ledger is None:
        raise InvalidInput("this server has no audit ledger; the audit log's proofs are not available here")
    return call.app.ledger


def aware_time(text: str | None, name: str) -> datetime | None:
    """`text` as a time that names its zone. Raises: InvalidInput when it is malformed or has no timezone."""
    if text is None:
        return None
    value = parse_timestamp(text)  # a malformed one is refused here, by name
    if datetime.fromisoformat(text.strip()).tzinfo is None:  # parse_timestamp would read it as UTC: be explicit
        raise InvalidInput(f"{name} '{text[:64]}' has no timezone: add Z or an offset, e.g. 2026-11-21T10:00:00Z")
    return value


def _status_line(status: dict[str, Any]) -> str:
    cp, last = status["last_checkpoint"], status["last_verified"]
    signed = f"checkpoint #{cp['number']} at {cp['at']}" if cp else "no checkpoint yet"
    verified = "never verified" if last is None else f"last verified {last['at']}: {'ok' if last['ok'] else 'BROKEN'}"
    if last is not None and last.get("first"):
        verified += f" (first: {last['first']})"
    unsigned = f"{status['unsigned_records']} record(s) in {status['unsigned_chains']} chain(s) no checkpoint covers"
    if status.get("pending_records"):
        unsigned += f", {status['pending_records']} waiting for their link"
    key = f"; the key file cannot be read: {status['key_error']}" if status.get("key_error") else ""
    return f"{signed}; {verified}; {unsigned}{key}"


def _verify_line(report: VerifyReport) -> str:
    counts = f"{report.records} record(s) in {report.chains} chain(s), {report.checkpoints} checkpoint(s)"
    if report.ok:
        return f"ok: {counts}, {report.unsigned} record(s) not yet signed"
    return f"BROKEN: {len(report.findings)} finding(s) in {counts}; first: {report.findings[0].describe()}"


AUDIT_TOOLS = [audit_status, audit_verify, audit_checkpoint]
