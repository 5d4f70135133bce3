"""Adapters: SQLAlchemy persistence, Alembic, GitPython, settings, clock and ids."""
