"""Trajectories of chat answers (token ids, masks, logprobs, tool calls, timings) for the export.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "trajectories",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("conversation_id", sa.String(32), sa.ForeignKey("conversations.id", ondelete="CASCADE"), nullable=False),
        sa.Column("choice", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("messages", sa.JSON, nullable=False),
        sa.Column("trajectory", sa.JSON, nullable=False),
        sa.Column("stop_reason", sa.String(16), nullable=True),
        sa.Column("num_turns", sa.Integer, nullable=False),
        sa.Column("num_tool_calls", sa.Integer, nullable=False),
    )
    op.create_index("ix_trajectories_conversation_id", "trajectories", ["conversation_id"])


def downgrade() -> None:
    op.drop_index("ix_trajectories_conversation_id", "trajectories")
    op.drop_table("trajectories")
