"""Full-state capture (snapshots) while the binlog keeps flowing, without locks.

Netflix DBLog's watermark algorithm (Andreakis & Papapanagiotou, 2020), run
inside the producer loop, and Debezium's read-only variant with executed-GTID
watermarks for sources Cynomys may not write to.

Modules:
  task         ChunkedTask: the chunk/watermark lifecycle snapshot and verify
               share (the producer's protocol, jobs and requests, windows,
               emission at a boundary, confirm after checkpoint)
  coordinator  SnapshotCoordinator: a chunked task; READ rows of key-ordered
               chunks, keys dropped in the window, keyless tables whole
  window       one chunk between its watermarks: its phase; which keys the log changed
  watermark    DBLog watermark table / GTID watermarks around a chunk select
  chunker      key-ordered chunk SELECTs, last keys as JSON
  columns      information_schema -> the row decoder's schema and values
  gtid         MariaDB/MySQL executed-GTID sets
  source       the snapshot's SQL session on the source
  state        snapshot.json (progress, resume points) and request files; the
               job store and table parts verify shares
  command      `cynomys snapshot` (requests + progress bar)
"""
