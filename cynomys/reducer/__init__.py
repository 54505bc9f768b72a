"""Fold (producer and applier): the changes of one (table, key) collapse
into one net change through a rules table (``fold``; the producer's table
keeps what it ships exact for an applier holding any prefix), and net
changes render as minimal SQL per dialect (``sql``, the paper's records)."""
