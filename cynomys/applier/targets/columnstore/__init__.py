"""The columnstore target (see cynomys/applier/targets/base.py for the interface)."""
