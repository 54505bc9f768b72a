"""Cynomys transport package."""
