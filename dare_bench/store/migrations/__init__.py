"""Alembic migrations of the results store, run programmatically by `dare_bench.store.engine.open_database`.

New revision (developers): write `versions/NNNN_<what>.py` by hand (see script.py.mako for the shape), with
`down_revision` = the previous one, add its id to `REVISIONS` in `dare_bench/store/models.py`, and extend the ORM.
SQLite cannot ALTER most things, so use `op.batch_alter_table` for column changes.
"""
