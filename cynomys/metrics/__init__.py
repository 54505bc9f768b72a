"""Prometheus metrics, /healthz and the health reports of the daemons:
listeners on the stage events the loops hand over (``events``), never
readers of a loop's internals.  See monitor.py for the metric names."""

from __future__ import annotations

from cynomys.metrics.health import Health, Verdict
from cynomys.metrics.monitor import ApplierMonitor, ProducerMonitor

__all__ = ["ApplierMonitor", "Health", "ProducerMonitor", "Verdict"]
