"""Read and assemble (producer): binlog events from a live server
(``stream``) sorted into ten basic types through a table (``kinds``), row
images decoded losslessly (``rows``, ``tablemap``), transactions assembled
(``txn``); and the source-DDL parser (``ddl``: statement -> neutral
operations each target renders)."""
