"""Alembic environment: run with a connection handed in by Store.migrate()."""

from alembic import context

from llmgw_runtime.store.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
