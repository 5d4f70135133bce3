"""audit links are stored in the order they are written: `link_no`, `prev_no`, and the index on the record

Keyed by (chain_id, chain_seq), every chain a linker batch grew was a page of its own to write in a b-tree that
deepens with the history: on a history of 1,000,000 links a batch of 1,000 wrote ~1,100 pages, 28 ms, against ~250
pages, 5.5 ms, stored in link order (benchmarks/audit_link_batches.py; docs/decisions.md, "And at scale").

From here `audit_links` is keyed by `link_no`, given out by the linker in the order it links (each chain's links
in seq order), with a unique index on (record_table, record_id); `prev_no` is the chain's link before (a `--since`
window's first record needs its hash, and a session's chain is walked back by it), and `audit_chains.link_no` the
head's link. The links are copied in (chain, seq) order, so each chain's stay in seq order. The heads move to a
rowid table on SQLite (the chain id in its own index), copied in the order the chains last grew, so the heads a
pass rewrites sit together too (80 pages a pass instead of 258 on the same history).

Downgrading copies them back into the (chain_id, chain_seq) layout.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 22:30:00
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_LINK_COLUMNS = "chain_id, chain_seq, record_table, record_id, hash"


def upgrade() -> None:
    op.create_table(
        "audit_links_0017",
        sa.Column("link_no", sa.BigInteger().with_variant(sa.Integer, "sqlite"), autoincrement=False),
        sa.Column("chain_id", sa.String(120), nullable=False),
        sa.Column("chain_seq", sa.BigInteger, nullable=False),
        sa.Column("record_table", sa.String(20), nullable=False),
        sa.Column("record_id", sa.BigInteger, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("prev_no", sa.BigInteger, nullable=True),
        _primary_key("audit_links", "0017", "link_no"),
    )
    # Numbered in (chain, seq) order; a link's `prev_no` is the number before it when that is its chain's seq - 1
    # (a chain's first link, or the first after a prune, has none).
    op.execute(
        f"INSERT INTO audit_links_0017 (link_no, {_LINK_COLUMNS}, prev_no) "
        f"SELECT n, {_LINK_COLUMNS}, CASE WHEN before = chain_seq - 1 THEN n - 1 END FROM ("
        f"SELECT {_LINK_COLUMNS}, row_number() OVER (ORDER BY chain_id, chain_seq) AS n, "
        "lag(chain_seq) OVER (PARTITION BY chain_id ORDER BY chain_seq) AS before FROM audit_links) AS numbered "
        "ORDER BY n"
    )
    op.create_index("uq_audit_links_record", "audit_links_0017", ["record_table", "record_id"], unique=True)
    # The heads, with their links' numbers (found through the old key and the new index, one lookup each, while
    # both tables exist), in a table of their own kind now: rows in the order written (SQLite: a rowid table, the
    # chain id in an index an update leaves alone), copied in the order the chains last grew. A linker pass then
    # rewrites the heads of the sessions at work, which sit together near the end, not a page per chain.
    _create_heads("audit_chains_0017", rowid=True, link_no=True)
    op.execute(
        "INSERT INTO audit_chains_0017 (chain_id, seq, hash, signed_seq, link_no) "
        "SELECT chain_id, seq, hash, signed_seq, link_no FROM (SELECT h.chain_id, h.seq, h.hash, h.signed_seq, "
        "(SELECT n.link_no FROM audit_links o JOIN audit_links_0017 n ON n.record_table = o.record_table "
        "AND n.record_id = o.record_id WHERE o.chain_id = h.chain_id AND o.chain_seq = h.seq) AS link_no "
        "FROM audit_chains h) AS heads ORDER BY coalesce(link_no, 0), chain_id"
    )
    for table in ("audit_links", "audit_chains"):
        op.drop_table(table)
        op.rename_table(f"{table}_0017", table)
        _rename_primary_key(table, "0017")


def _create_heads(name: str, *, rowid: bool, link_no: bool) -> None:
    """The chains' head rows (`rowid`: SQLite's rowid table, since 0017; WITHOUT ROWID before)."""
    table, revision_ = name.rsplit("_", 1)
    columns: list[Any] = [
        sa.Column("chain_id", sa.String(120), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("signed_seq", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    ]
    if link_no:
        columns.append(sa.Column("link_no", sa.BigInteger, nullable=True))
    columns.append(_primary_key(table, revision_, "chain_id"))
    op.create_table(name, *columns, **({} if rowid else {"sqlite_with_rowid": False}))


def _primary_key(table: str, revision_: str, *columns: str) -> sa.PrimaryKeyConstraint:
    """The primary key of `table`'s copy `<table>_<revision_>`, named as the table's own will be: SQLite cannot
    rename a constraint (and does not need its name to be unique); PostgreSQL names it after the copy until
    `_rename_primary_key` (its name is an index's, unique while both tables exist)."""
    postgres = op.get_bind().dialect.name == "postgresql"
    return sa.PrimaryKeyConstraint(*columns, name=f"pk_{table}_{revision_}" if postgres else f"pk_{table}")


def _rename_primary_key(table: str, revision_: str) -> None:
    """PostgreSQL: the primary key of a table created as `<table>_<revision_>` takes the table's own name."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE {table} RENAME CONSTRAINT pk_{table}_{revision_} TO pk_{table}")


def downgrade() -> None:
    op.create_table(
        "audit_links_0016",
        sa.Column("chain_id", sa.String(120), nullable=False),
        sa.Column("chain_seq", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("record_table", sa.String(20), nullable=False),
        sa.Column("record_id", sa.BigInteger, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        _primary_key("audit_links", "0016", "chain_id", "chain_seq"),
        sqlite_with_rowid=False,
    )
    op.execute(f"INSERT INTO audit_links_0016 ({_LINK_COLUMNS}) SELECT {_LINK_COLUMNS} FROM audit_links")
    _create_heads("audit_chains_0016", rowid=False, link_no=False)
    op.execute(
        "INSERT INTO audit_chains_0016 (chain_id, seq, hash, signed_seq) "
        "SELECT chain_id, seq, hash, signed_seq FROM audit_chains"
    )
    op.drop_index("uq_audit_links_record", table_name="audit_links")
    for table in ("audit_links", "audit_chains"):
        op.drop_table(table)
        op.rename_table(f"{table}_0016", table)
        _rename_primary_key(table, "0016")
