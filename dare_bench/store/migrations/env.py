"""Alembic environment: migrate the connection handed over by `dare_bench.store.engine` (never a URL of its own).

The caller already holds a write transaction (BEGIN IMMEDIATE on SQLite), so concurrent processes opening one
new database migrate it exactly once and the others wait.
"""

from alembic import context

from dare_bench.store.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
