"""RL runs (GRPO-RoC and SFT): the run, its per-step metrics, and its checkpoints.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rl_runs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("model", sa.String(1024), nullable=False),
        sa.Column("recipe", sa.JSON, nullable=False),
        sa.Column("data", sa.String(1024), nullable=False),
        sa.Column("run_dir", sa.String(1024), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("total_steps", sa.Integer, nullable=False),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
    )
    op.create_table(
        "rl_steps",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("rl_runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("stage", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metrics", sa.JSON, nullable=False),
        sa.UniqueConstraint("run_id", "step", name="uq_rl_step"),
    )
    op.create_index("ix_rl_steps_run_id", "rl_steps", ["run_id"])
    op.create_table(
        "rl_checkpoints",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("rl_runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("removed", sa.Boolean, nullable=False),
        sa.UniqueConstraint("run_id", "step", name="uq_rl_checkpoint"),
    )
    op.create_index("ix_rl_checkpoints_run_id", "rl_checkpoints", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_rl_checkpoints_run_id", "rl_checkpoints")
    op.drop_table("rl_checkpoints")
    op.drop_index("ix_rl_steps_run_id", "rl_steps")
    op.drop_table("rl_steps")
    op.drop_table("rl_runs")
