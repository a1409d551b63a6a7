"""The backends: SQLite (and its in-memory form), PostgreSQL, their connection helpers and
their space reclaiming. Each supplies only what its database does differently; the top
layer of ``pitstop.store`` below ``open_store``."""
