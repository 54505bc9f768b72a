-- What the Cynomys producer needs on the source: read the binlog and the tables.
GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO 'cynomys'@'%';
-- The DBLog watermark table lives in its own schema (not needed with [snapshot] read_only = true).
GRANT ALL ON cynomys_meta.* TO 'cynomys'@'%';
