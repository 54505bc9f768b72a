"""Cynomys parser package."""
