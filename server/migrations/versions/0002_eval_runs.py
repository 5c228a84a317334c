"""Evaluation runs and their graded samples.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "eval_runs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("endpoint", sa.String(512), nullable=False),
        sa.Column("suite", sa.JSON, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("summary", sa.JSON, nullable=False),
        sa.Column("run_dir", sa.String(1024), nullable=False),
    )
    op.create_table(
        "eval_samples",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("eval_runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("benchmark", sa.String(64), nullable=False),
        sa.Column("doc_id", sa.String(256), nullable=False),
        sa.Column("sample_index", sa.Integer, nullable=False),
        sa.Column("score", sa.Float, nullable=False),
        sa.Column("grade", sa.JSON, nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("response", sa.JSON, nullable=True),
        sa.Column("trajectory", sa.JSON, nullable=True),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("num_turns", sa.Integer, nullable=False),
        sa.Column("num_tool_calls", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("run_id", "benchmark", "doc_id", "sample_index", name="uq_eval_sample"),
    )
    op.create_index("ix_eval_samples_run_id", "eval_samples", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_eval_samples_run_id", "eval_samples")
    op.drop_table("eval_samples")
    op.drop_table("eval_runs")
