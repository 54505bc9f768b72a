"""The receive stage: the applier's subscription to the transport.

A partition (applier/partition.py) reads through a consumer group of its
own; every partition's group is created at once, so the producer's trimming
(which keeps what any group has not acknowledged) never drops entries a
partition that has not started yet still needs."""
from __future__ import annotations

from dataclasses import replace

from cynomys.applier.partition import Partitioning
from cynomys.core.config import Config
from cynomys.transport.bus import Subscriber, open_subscriber


def make_subscriber(cfg: Config) -> Subscriber:
    tcfg = cfg.transport
    if tcfg.kind == "file":
        tcfg = replace(tcfg, path=str(cfg.resolve(tcfg.path)))
    # A partition reads through a consumer group of its own; every
    # partition's group is created at once, so the producer's trimming
    # (which keeps what any group has not acknowledged) never drops entries
    # a partition that has not started yet still needs.
    part = Partitioning.of(cfg)
    return open_subscriber(replace(tcfg, consumer_group=part.group(tcfg.consumer_group)),
                           part.consumer(cfg.applier.consumer_name),
                           sibling_groups=part.groups(tcfg.consumer_group))
