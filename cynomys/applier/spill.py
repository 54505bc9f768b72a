"""The applier's memory bound: a source transaction of any size in bounded memory.

The delay buffer (applier/batcher.py) holds net changes until a flush, and
a flush must end on a source transaction boundary.  A transaction the
producer cut into fragments (producer/batching.py) would otherwise be
buffered whole: a 2,000,000-row UPDATE took the applier to 3.4 GB.  So the
buffer's memory is estimated as envelopes arrive, and when it would pass
``[applier] max_memory_mb`` times ``BUFFER_SHARE``:

- a buffer that ends on a transaction boundary is flushed, as when full;
- otherwise the whole transactions buffered before the large one are
  committed first (they were set apart: ``DelayBuffer.seal``), and the
  large one's buffered part is applied into the target as one *part* of
  it (targets/base.py ``apply_part``): into a target transaction kept open
  until the transaction's last fragment arrives (MariaDB/ColumnStore,
  MonetDB, DuckDB), or staged where no reader looks (Spark/Iceberg: a
  branch of each table).  The flush that follows its last fragment
  commits all of it with the applied state (``commit_parts``).

Exactly once holds as before: nothing of the transaction is committed
before its end, its envelopes stay unacknowledged until then, and a crash
rolls the open transaction back (the server does, when the connection
drops), so the target is as it was and the envelopes are delivered again.
A producer that sends the transaction again from its start makes the
applier drop what it holds of the earlier attempt: the buffer's open part
and the parts applied (``rollback_parts``).

The estimate: an opened envelope's payload (Avro, uncompressed) becomes
Python objects (tuples of values, the Change, the fold's dict entry) about
``EXPANSION`` times its size.  Measured on lineitem rows (16 columns:
integers, DECIMALs, dates, short strings), envelopes of 5,000 rows decoded
and folded (tracemalloc; ``bench/bigtxn.py --expansion`` prints it): UPDATE
payload 1.21 MB, held 12.7 MB (x10.5); DELETE 0.70 MB, 7.7 MB (x11.0); the
decode's transient peak is x16-18 of one envelope.  Over-estimating
only spills earlier; the share leaves room for the Python process itself
(~70 MB with pymysql and pyarrow), the envelopes of one transport read and
the flush being built from the buffer (row texts for LOAD DATA, Arrow
tables for Spark), which can double the buffer for a moment.
"""
from __future__ import annotations

from typing import Sequence

from cynomys.core.columnar import InsertRun
from cynomys.core.model import Change

#: Bytes of Python objects per byte of decoded payload (see above).
EXPANSION = 11

#: The same for an envelope of column-wise runs only (a snapshot chunk's
#: READ rows, bulk inserts: core/columnar.py), whose values stay in Arrow
#: arrays and only the keys become Python objects.  Measured the same way
#: (200,000 lineitem READ rows in 40 envelopes, decoded column-wise into
#: the fold; RSS, since Arrow's memory is outside tracemalloc): payload
#: 23.7 MB, held 64 MB (x2.7).  Counting such envelopes at x11 ended Spark
#: flushes of an initial load at ~100k rows, where each flush costs a
#: second whatever its size (issue #24).
RUN_EXPANSION = 3

#: The share of ``[applier] max_memory_mb`` the delay buffer may hold.
BUFFER_SHARE = 0.35


def cost(payload_bytes: int, changes: Sequence[Change] = ()) -> int:
    """The estimated memory of an envelope's changes once buffered."""
    runs_only = bool(changes) and all(type(c) is InsertRun for c in changes)
    return payload_bytes * (RUN_EXPANSION if runs_only else EXPANSION)


def budget(max_memory_mb: int) -> int:
    """How many bytes (estimated) the delay buffer may hold."""
    return int(max_memory_mb * 1024 * 1024 * BUFFER_SHARE)


#: The share of ``[applier] max_memory_mb`` one transport read may bring in
#: (sealed envelopes, held until each is opened and buffered).  A read of
#: 200 envelopes is a few MB of OLTP changes but ~40 MB of snapshot chunks;
#: measured on a Spark initial load of 10M lineitem rows, such reads made the
#: applier's RSS jump by up to 90 MB above its ~400 MB for a moment (redis-py
#: holds the reply beside the envelopes cut from it), to a 498 MB peak.
READ_SHARE = 0.03


def read_count(max_memory_mb: int, envelope_bytes: float, most: int) -> int:
    """Envelopes to ask the transport for at once: ``most``, fewer when
    envelopes of ``envelope_bytes`` (the recent ones'; 0: none seen yet)
    would pass READ_SHARE of the memory bound; at least one."""
    if envelope_bytes <= 0:
        return most
    return max(1, min(most, int(max_memory_mb * 1024 * 1024 * READ_SHARE / envelope_bytes)))
