"""audit links are stored in the order they are written: `link_no`, `prev_no`, and the index on the record

Keyed by (chain_id, chain_seq), every chain a linker batch grew was a page of its own to write in a b-tree that
deepens with the history: on a history of 1,000,000 links a batch of 1,000 wrote ~1,100 pages, 28 ms, against ~250
pages, 5.5 ms, stored in link order (benchmarks/audit_link_batches.py; docs/decisions.md, "And at scale").

From here `audit_links` is keyed by `link_no`, given out by the linker in the order it links (each chain's links
in seq order), with a unique index on (record_table, record_id); `prev_no` is the chain's link before (a `--since`
window's first record needs its hash, and a session's chain is walked back by it), and `audit_chains.link_no` the
head's link. The links are copied in (chain, seq) order, so each chain's stay in seq order.

Downgrading copies them back into the (chain_id, chain_seq) layout.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 22:30:00
"""

from __future__ import annotations

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
        sa.Column(
            "link_no", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=False
        ),
        sa.Column("chain_id", sa.String(120), nullable=False),
        sa.Column("chain_seq", sa.BigInteger, nullable=False),
        sa.Column("record_table", sa.String(20), nullable=False),
        sa.Column("record_id", sa.BigInteger, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("prev_no", sa.BigInteger, nullable=True),
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
    op.add_column("audit_chains", sa.Column("link_no", sa.BigInteger, nullable=True))
    # Each head's link, found through the old key and the new index (one lookup each, while both tables exist).
    op.execute(
        "UPDATE audit_chains SET link_no = (SELECT n.link_no FROM audit_links o JOIN audit_links_0017 n "
        "ON n.record_table = o.record_table AND n.record_id = o.record_id "
        "WHERE o.chain_id = audit_chains.chain_id AND o.chain_seq = audit_chains.seq)"
    )
    op.drop_table("audit_links")
    op.rename_table("audit_links_0017", "audit_links")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE audit_links RENAME CONSTRAINT pk_audit_links_0017 TO pk_audit_links")


def downgrade() -> None:
    op.create_table(
        "audit_links_0016",
        sa.Column("chain_id", sa.String(120), primary_key=True),
        sa.Column("chain_seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("record_table", sa.String(20), nullable=False),
        sa.Column("record_id", sa.BigInteger, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sqlite_with_rowid=False,
    )
    op.execute(f"INSERT INTO audit_links_0016 ({_LINK_COLUMNS}) SELECT {_LINK_COLUMNS} FROM audit_links")
    op.drop_index("uq_audit_links_record", table_name="audit_links")
    op.drop_table("audit_links")
    op.rename_table("audit_links_0016", "audit_links")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE audit_links RENAME CONSTRAINT pk_audit_links_0016 TO pk_audit_links")
    with op.batch_alter_table("audit_chains") as batch:
        batch.drop_column("link_no")
