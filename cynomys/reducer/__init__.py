"""Cynomys reducer package."""
