"""Cynomys applier/targets package."""
