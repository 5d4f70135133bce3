"""SQLAlchemy persistence: tables, engine and locking, repositories, unit of work, migrations."""
