"""The open stage, run ahead of the apply: sealed envelopes are verified,
decrypted, gunzipped and decoded on a worker thread while the loop applies
the ones before them.

Why: the loop was serial -- open and decode an envelope, buffer it, flush
it into the target -- so the target server sat idle while the applier
opened the next envelope, and the applier sat idle while the server loaded
and committed.  In an initial load a flush is about one snapshot chunk, and
the server's work on it (LOAD DATA, commit) is a socket wait for the applier:
the worker opens the next chunk meanwhile (its C parts hold the GIL only
while the loop waits on the server or runs in pyarrow's kernels).

Order is kept: the loop takes results in delivery order, and a rejected
envelope's error is raised where the loop takes it, exactly as if it had been
opened there.  Memory: at most ``AHEAD`` envelopes are opened before the loop
asks for them (each at most ``[transport] max_envelope_bytes`` once opened);
the rest of a read stays sealed until then.  The transport is only ever used
by the loop's thread.  ``Opener`` is thread-safe and the codec's decoding
keeps no state between calls.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from cynomys.core.model import Batch
from cynomys.schemas import codec
from cynomys.transport.bus import Delivery
from cynomys.transport.envelope import Opened, Opener

#: Envelopes opened ahead of the loop: one is enough to cover a flush of
#: about one envelope (a snapshot chunk); the second covers a fast flush.
AHEAD = 2


@dataclass(frozen=True)
class Unsealed:
    """An envelope opened (verified, decrypted, gunzipped) and its batch decoded."""
    opened: Opened
    batch: Batch


def unseal(opener: Opener, envelope: bytes) -> Unsealed:
    opened = opener.open(envelope)
    return Unsealed(opened, codec.decode_columnar(opened.payload))  # INSERT runs stay column-wise


class OpenAhead:
    """Deliveries in order, the next ``ahead`` (at least one) of them being
    opened on a worker thread."""

    def __init__(self, opener: Opener, ahead: int = AHEAD) -> None:
        if ahead < 1:
            raise ValueError("ahead is at least 1")
        self._opener = opener
        self._ahead = ahead
        self._pool: ThreadPoolExecutor | None = None
        self._queue: deque[tuple[Delivery, Future[Unsealed] | None]] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, deliveries: list[Delivery]) -> None:
        self._queue.extend((d, None) for d in deliveries)
        self._submit()

    def take(self) -> tuple[Delivery, Callable[[], Unsealed]]:
        """The next delivery and its opening's result (when ready; raising
        what opening it raised)."""
        d, fut = self._queue.popleft()
        assert fut is not None, "the first `ahead` deliveries are always submitted"
        self._submit()
        return d, fut.result

    def _submit(self) -> None:
        for i in range(min(self._ahead, len(self._queue))):
            d, fut = self._queue[i]
            if fut is None:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="cynomys-open")
                self._queue[i] = (d, self._pool.submit(unseal, self._opener, d.envelope))

    def close(self) -> None:
        """Drop what is left (never acknowledged: delivered again at the next
        start) and end the worker once its current envelope is done."""
        self._queue.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
