"""The applier daemon (analytics host): receive -> open -> admit -> route -> shape -> buffer -> commit.

* ``receive``    the subscription to the transport (a consumer group per partition);
* ``loop``       the daemon's loop: opens each envelope (transport.channel),
                 passes it through the admit stage, routes it, buffers it and
                 commits flushes -- data and state in one target transaction;
* ``admit``      every integrity rule in one place: fence, sequence chain,
                 continuity, and which changes the target lacks (by position,
                 or by GTID across servers);
* ``partition``  route: which tables this applier owns (mod partitioning);
* ``shaping``    each target table's mode (soft_delete, history) and
                 schema-change policy ([shape.targets], cynomys/shape);
* ``batcher``    buffer: delay commit, net changes folded across envelopes;
* ``targets/``   commit: one folder per column store (its SQL, types, bulk
                 path, verify and config), behind the Target interface.
"""
