"""Verify: compare source and target while writes go on, and repair.

One package, both sides of the wire:

* ``checksum``     key ranges (byte order on every side) and their row count
                   and hash: the one definition the source and every target
                   compute;
* ``coordinator``  the producer task (a chunked task, snapshot/task.py):
                   chunks a table between watermarks, computes each range's
                   checksum on the source and sends a CHECKSUM record at its
                   place in the log (and, to repair, a PURGE plus the range's
                   rows);
* ``state``        verify.json (jobs, tasks, resume points) and request files;
* ``applier``      the applier side: after committing everything before a
                   record, the target's checksum of the same range (its SQL
                   path where it has one, targets/<kind>/verify.py);
* ``command``      `cynomys verify`: writes the request, waits, reports.
"""
