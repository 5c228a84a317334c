"""When each conversation last had an exchange, so the retention purge can find the old ones by an index.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("conversations", sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE conversations SET updated_at = created_at")
    op.create_index("ix_conversations_updated_at", "conversations", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_conversations_updated_at", "conversations")
    with op.batch_alter_table("conversations") as batch:
        batch.drop_column("updated_at")
