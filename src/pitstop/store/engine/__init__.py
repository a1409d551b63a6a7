"""The SQL engine: the schema and its migrations, the one SQL text both dialects run, and
the parts of :class:`~pitstop.store.engine.sql.SqlStore` (reads, saves, leases, inputs,
effects, children, maintenance). Imports the encoding and the contract, never a backend."""
