"""The duckdb target (see cynomys/applier/targets/base.py for the interface)."""
