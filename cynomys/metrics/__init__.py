"""Prometheus metrics, /healthz and the health reports of the daemons
(issue #16).  See monitor.py for the metric names."""
from __future__ import annotations

from cynomys.metrics.health import Health, Verdict
from cynomys.metrics.monitor import ApplierMonitor, ProducerMonitor

__all__ = ["ApplierMonitor", "Health", "ProducerMonitor", "Verdict"]
