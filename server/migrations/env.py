"""Alembic environment: migrations always run on the connection `rstar.server.db.upgrade` hands in."""

from alembic import context

from rstar.server.db import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
