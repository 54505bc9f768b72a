"""Cynomys core package."""
