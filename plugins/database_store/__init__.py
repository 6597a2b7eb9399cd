"""The database store: page store and journal over SQL (SQLAlchemy Core)."""
