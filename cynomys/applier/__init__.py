"""Cynomys applier package."""
