"""Cynomys schemas package."""
