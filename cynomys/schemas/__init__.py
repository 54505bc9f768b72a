"""The record format on the wire: Avro schemas (``*.avsc``) with the paper's
fields and typed row images, and the codec (``codec``: Batch <-> bytes,
row-wise or column-wise for the applier's bulk paths)."""
