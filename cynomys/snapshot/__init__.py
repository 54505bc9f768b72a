"""Full-state capture (snapshots) while the binlog keeps flowing, without locks.

Netflix DBLog's watermark algorithm (Andreakis & Papapanagiotou, 2020), run
inside the producer loop, and Debezium's read-only variant with executed-GTID
watermarks for sources Cynomys may not write to.

Modules:
  coordinator  SnapshotCoordinator: the producer's hooks (observe, poll,
               checkpointed); jobs, chunks, windows, emission, resume
  window       one chunk between its watermarks: which keys the log changed
  watermark    DBLog watermark table / GTID watermarks around a chunk select
  chunker      key-ordered chunk SELECTs, last keys as JSON
  columns      information_schema -> the row decoder's schema and values
  gtid         MariaDB/MySQL executed-GTID sets
  source       the snapshot's SQL session on the source
  state        snapshot.json (progress, resume points) and request files
  command      `cynomys snapshot` (requests + progress bar)
"""
