"""audit chains: a link (chain, seq, hash) for every transition row, decision and event, the chains' heads, and
signed checkpoints over them (docs/audit.md). Records written before this revision are chained here, in the
order they were written, so that the first checkpoint seals them as they stand now

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25 10:00:00
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

from taskgate.domain.audit.chain import AUDITED_FIELDS, GENESIS, PRIMARY_KEYS, canonical_fields, chain_of, link_hash

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_JSON_FIELDS = {"guard_results", "override_policies", "policy_results", "payload"}
_TABLE_ORDER = {"transition_log": 0, "decisions": 1, "events": 2}  # within one instant: the order a fire writes
_BATCH = 2000


def upgrade() -> None:
    op.create_table(
        "audit_links",
        sa.Column("chain_id", sa.String(120), primary_key=True),
        sa.Column("chain_seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("record_table", sa.String(20), nullable=False),
        sa.Column("record_id", sa.BigInteger, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sqlite_with_rowid=False,  # SQLite: the row in its primary key's b-tree, one b-tree less to write per link
    )
    op.create_index("uq_audit_links_record", "audit_links", ["record_table", "record_id"], unique=True)
    op.create_table(
        "audit_chains",
        sa.Column("chain_id", sa.String(120), primary_key=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("signed_seq", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "audit_checkpoints",
        sa.Column("number", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.String(20), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("signature", sa.Text, nullable=True),
        sa.Column("key_id", sa.String(64), nullable=False),
    )
    _chain_existing_records(op.get_bind())


def _chain_existing_records(conn: sa.Connection) -> None:
    """Link every record already written, per chain in (time, table, id) order. Nothing is signed here: the first
    checkpoint (made at the next start that has the key, or by `taskgate audit checkpoint`) seals these heads."""
    chains: dict[str, list[tuple[Any, int, str, int, dict[str, Any]]]] = defaultdict(list)
    for table, names in AUDITED_FIELDS.items():
        columns = [sa.column(n, sa.JSON() if n in _JSON_FIELDS else None) for n in names]
        for row in conn.execute(sa.select(*columns).select_from(sa.table(table))).mappings():
            values = {n: _stored(row[n]) if n == "at" else row[n] for n in names}
            fields = canonical_fields(table, values)
            chains[chain_of(table, values)].append(
                (fields["at"], _TABLE_ORDER[table], table, values[PRIMARY_KEYS[table]], fields)
            )
    links, heads = [], []
    for chain, records in chains.items():
        prev = GENESIS
        for seq, (_at, _order, table, record_id, fields) in enumerate(
            sorted(records, key=lambda r: (*r[:2], r[3])), 1
        ):
            prev = link_hash(chain, seq, prev, table, fields)
            links.append(
                {"chain_id": chain, "chain_seq": seq, "record_table": table, "record_id": record_id, "hash": prev}
            )
        heads.append({"chain_id": chain, "seq": len(records), "hash": prev, "signed_seq": 0})
    link_table = sa.table(
        "audit_links", *(sa.column(c) for c in ("chain_id", "chain_seq", "record_table", "record_id", "hash"))
    )
    head_table = sa.table("audit_chains", *(sa.column(c) for c in ("chain_id", "seq", "hash", "signed_seq")))
    for start in range(0, len(links), _BATCH):
        conn.execute(sa.insert(link_table), links[start : start + _BATCH])
    if heads:
        conn.execute(sa.insert(head_table), heads)


def _stored(value: Any) -> datetime:
    """A stored timestamp as taskgate reads it: SQLite keeps naive UTC text, PostgreSQL an aware instant."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def downgrade() -> None:
    op.drop_table("audit_checkpoints")
    op.drop_table("audit_chains")
    op.drop_index("uq_audit_links_record", table_name="audit_links")
    op.drop_table("audit_links")
