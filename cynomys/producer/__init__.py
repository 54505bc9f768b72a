"""The producer daemon (source host): read -> assemble -> shape -> fold/batch -> seal/publish -> checkpoint.

* ``loop``      the daemon's loop: a reader thread pulls binlog events into a
                bounded queue; the loop assembles transactions (parser.txn),
                runs the plugged tasks between events, and hands changes to
                the batching stage;
* ``tasks``     the protocol of the plugged tasks (verify, snapshot) and their
                order, declared once with its reason;
* ``batching``  the batch under construction: the shape stage (cynomys/shape:
                routes, columns, masks, filters), folding (reducer.fold), cutting
                large transactions into fragments, the envelope's metadata, and
                the checkpoint discipline around each publish;
* ``state``     what the producer persists (checkpoint, sequence, open
                transaction, incarnation, source server) and where;
* ``ha``        one leader among many producers: the lease, fencing, the
                state in Redis.

Sealing and publishing live with the wire (``transport.channel``).
"""
from cynomys.producer.loop import BatchSink, Producer, run_with_retry
from cynomys.producer.state import FileStateStore, ProducerState, StateStore

__all__ = ["BatchSink", "FileStateStore", "Producer", "ProducerState", "StateStore", "run_with_retry"]
