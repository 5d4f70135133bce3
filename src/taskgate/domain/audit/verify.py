"""Re-computing the audit chains: the walk over their links that names the first broken record.

The same walk checks a database (`taskgate audit verify`) and an export file (`--file`), fed the links of each
chain in seq order. For every link it checks that the record is still there, that it follows the record before it
(no gap, the previous hash), and that its fields still hash to the link's hash. Where a checkpoint signed a chain's
head, the chain must still reach that seq with that hash; a prune anchor says where a pruned chain resumes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from taskgate.domain.audit.chain import GENESIS, link_hash
from taskgate.domain.audit.checkpoints import ChainPoint


@dataclass(frozen=True, slots=True)
class Finding:
    """One broken thing: `where` is the record ("transition_log 42"), checkpoint or chain; `problem` says what."""

    where: str
    problem: str
    chain: str | None = None
    seq: int | None = None

    def describe(self) -> str:
        at = f" ({self.chain} #{self.seq})" if self.chain and self.seq is not None else ""
        return f"{self.where}{at}: {self.problem}"

    def as_dict(self) -> dict[str, Any]:
        return {"where": self.where, "chain": self.chain, "seq": self.seq, "problem": self.problem}


@dataclass(frozen=True, slots=True)
class LinkRow:
    """One link with its record: `fields` canonical, or None when the record is gone; `prev` is the stored hash of
    the link at `seq - 1` (None when there is none); `no` its place in the order links were written (0 when it
    does not come from a database)."""

    chain: str
    seq: int
    table: str
    record_id: int
    hash: str
    prev: str | None
    fields: Mapping[str, Any] | None
    no: int = 0


@dataclass(slots=True)
class _Chain:
    first: int
    last: int
    last_hash: str


@dataclass(slots=True)
class ChainWalk:
    """Feed it every link of the chains to check, each chain's in seq order; then `finish()`.

    `signed` are the heads the valid checkpoints signed, `anchors` where pruned chains resume; `stored_heads` (the
    database's own head rows, when checking a database) must agree with the last link of each chain walked.
    """

    signed: Mapping[str, ChainPoint] = field(default_factory=dict)
    anchors: Mapping[str, ChainPoint] = field(default_factory=dict)
    stored_heads: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    complete: bool = True  # every record of each chain is fed (not a `--since` window): chains start at the start
    findings: list[Finding] = field(default_factory=list)
    records: int = 0
    unsigned: int = 0
    _chains: dict[str, _Chain] = field(default_factory=dict)

    def feed(self, link: LinkRow) -> None:
        """Check one link against its record and the link before it."""
        self.records += 1
        seen = self._chains.get(link.chain)
        anchor = self.anchors.get(link.chain, ChainPoint(0, GENESIS))
        prev, gap = self._prev(link, seen, anchor)
        if not gap:
            self._check_link(link, prev, anchor)
        if seen is None:
            self._chains[link.chain] = _Chain(link.seq, link.seq, link.hash)
        else:
            seen.last, seen.last_hash = link.seq, link.hash
        self._check_heads(link)

    def _check_heads(self, link: LinkRow) -> None:
        signed = self.signed.get(link.chain)
        if signed is None or link.seq > signed.seq:
            self.unsigned += 1
        elif link.seq == signed.seq and link.hash != signed.hash:
            self._add(link, f"checkpoint #{signed.checkpoint} signed hash {signed.hash[:16]}… for this seq, the "
                            f"chain has {link.hash[:16]}…: the chain was rewritten")  # fmt: skip
        stored = self.stored_heads.get(link.chain)
        if stored is not None and link.seq == stored[0] and link.hash != stored[1]:
            self._add(link, f"the chain's head row holds hash {stored[1][:16]}… for this seq: the chain was rewritten")

    def _prev(self, link: LinkRow, seen: _Chain | None, anchor: ChainPoint) -> tuple[str | None, bool]:
        """The hash this link must follow, and whether records before it are missing (that finding is made here).

        Within the walk a chain must run without a gap, and a complete walk must start it right after its anchor
        (seq 1, or where a prune resumed it): an export's own `prev` is trusted only at a window's first record.
        """
        if seen is not None and seen.last == link.seq - 1:
            return seen.last_hash, False
        if link.seq == anchor.seq + 1:
            return anchor.hash, False
        if link.seq <= anchor.seq:
            return link.prev, False
        first = seen.last + 1 if seen is not None else anchor.seq + 1
        if seen is None and not self.complete:
            return link.prev, False  # a window starts mid-chain: its first record follows the hash it names
        missing = f"#{first} of its chain is" if first == link.seq - 1 else f"#{first}–#{link.seq - 1} of its chain are"
        self._add(link, f"follows no record: {missing} missing (deleted with its link)")
        return None, True

    def _check_link(self, link: LinkRow, prev: str | None, anchor: ChainPoint) -> None:
        if link.seq <= anchor.seq:
            self._add(
                link, f"is still here though checkpoint #{anchor.checkpoint} pruned its chain up to #{anchor.seq}"
            )
        elif link.fields is None:
            self._add(link, "is missing: the record was deleted, its link remains")
        elif prev is None:
            self._add(link, f"follows no record: #{link.seq - 1} of its chain is missing (deleted with its link)")
        elif link_hash(link.chain, link.seq, prev, link.table, link.fields) != link.hash:
            cause = "its fields or its place changed after it was written"
            if link.prev is not None and link.prev != prev:
                cause = "the record before it was changed, or this link was rewritten"
            self._add(link, f"does not hash to its link: {cause}")

    def _add(self, link: LinkRow, problem: str) -> None:
        self.findings.append(Finding(f"{link.table} {link.record_id}", problem, link.chain, link.seq))

    def finish(self) -> None:
        """Check each chain's end against its signed head and its head row: a chain that ends before either lost
        its tail. (Both were read before the links, so a record appended meanwhile only extends a chain.)

        In a complete walk (not a `--since` window) a chain with a signed head or a head row that was not walked is
        one whose every record is gone.
        """
        for chain, point in self.signed.items():
            self._check_end(chain, point.seq, f"checkpoint #{point.checkpoint} signed #{point.seq}", self.complete)
        for chain, (seq, _hash) in self.stored_heads.items():
            self._check_end(chain, seq, f"its head row says #{seq}", self.complete)

    def _check_end(self, chain: str, seq: int, claim: str, complete: bool) -> None:
        walked = self._chains.get(chain)
        if walked is None:
            if complete and seq > self.anchors.get(chain, ChainPoint(0, GENESIS)).seq:
                self.findings.append(Finding(f"chain {chain}", f"{claim}, and no record of it remains", chain, seq))
        elif walked.last < seq and walked.first <= seq:
            lost = seq - walked.last
            self.findings.append(Finding(f"chain {chain}", f"ends at #{walked.last}, but {claim}: its last {lost} "
                                         "record(s) were removed", chain, walked.last + 1))  # fmt: skip

    @property
    def chains(self) -> int:
        return len(self._chains)
