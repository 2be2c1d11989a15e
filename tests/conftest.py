"""Fixtures shared by every test directory: a Postgres server (``postgres_url``) and a fresh schema per
test (``pg_schema``), see :mod:`tests.postgres`."""

pytest_plugins = ["tests.postgres"]
