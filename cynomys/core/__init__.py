"""What every stage shares and nothing else: the frozen data that crosses
module boundaries (model: Position, Change, Batch, EnvelopeMeta), the
config as validated dataclasses, errors marked transient or terminal, GTID
sets, atomic checkpoints, the column-wise insert runs, the compiled-path
switch.  Imports nothing else of Cynomys."""
