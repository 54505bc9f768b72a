"""File transport: one append-only local file of length-prefixed records.

Record layout (big-endian)::

    body_len   4   u32, bytes after this field (producer_len .. crc)
    producer_len 1 u8
    producer   P   UTF-8
    seq        8   u64
    envelope   E   the sealed envelope
    crc32      4   of producer_len .. envelope

Every publish is one write(2) followed by fsync, under an exclusive flock.
A publisher that dies mid-write leaves a torn tail; the next publisher cuts
it off before appending.  A subscriber keeps its position in
``<file>.<consumer>.offset`` and moves it only on ack, so what was read but
not acknowledged is read again after a restart (at-least-once).
Used by `cynomys tail`, and by tests that need no Redis.

Publishing is idempotent per (producer, seq): a seq at or below the highest
record of that producer is not written again.  That "already there" is
checked against the record itself (``_check_held``): a record appended by
another writer with a higher seq would otherwise swallow every later
envelope while the producer moves its checkpoint on.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

from cynomys.core.checkpoint import fsync_dir
from cynomys.core.errors import TerminalError, TransportUnavailableError
from cynomys.transport.bus import Backoff, Delivery, TransportStateAltered, same_envelope

log = logging.getLogger(__name__)

_U32 = struct.Struct(">I")
_U8 = struct.Struct(">B")
_U64 = struct.Struct(">Q")
_POLL_S = 0.02
# The smallest possible body: producer_len + 1-byte producer + seq + crc.
_MIN_BODY = 1 + 1 + 8 + 4
# After a damaged record, the subscriber keeps handing out nothing (instead
# of failing) until the records before it are acknowledged, so the applier
# commits them first; an applier that never acknowledges them (they end in a
# transaction the damaged record would have finished) gets the error after
# this long.
DAMAGE_GRACE_S = 30.0


class CorruptTransportFile(TerminalError):
    """A complete record in the transport file fails its checksum."""


def _record(producer_id: str, seq: int, envelope: bytes) -> bytes:
    p = producer_id.encode("utf-8")
    if not 1 <= len(p) <= 255:
        raise ValueError(f"producer id {producer_id!r} must be 1..255 UTF-8 bytes")
    body = _U8.pack(len(p)) + p + _U64.pack(seq) + envelope
    body += _U32.pack(zlib.crc32(body))
    return _U32.pack(len(body)) + body


def _read_record(fd: int, pos: int, path: Path) -> tuple[int, str, int, bytes] | None:
    """(end offset, producer, seq, envelope) of the record at ``pos``, or None
    when the record is not (yet) complete in the file."""
    head = os.pread(fd, 4, pos)
    if len(head) < 4:
        return None
    (n,) = _U32.unpack(head)
    body = os.pread(fd, n, pos + 4)
    if len(body) < n:
        return None
    if n < _MIN_BODY or zlib.crc32(body[:-4]) != _U32.unpack(body[-4:])[0]:
        raise CorruptTransportFile(f"transport file {path} is damaged at offset {pos} (checksum mismatch)",
                                   hint="move the file aside; records before that offset are intact")
    plen = body[0]
    producer = body[1:1 + plen].decode("utf-8", errors="replace")
    (seq,) = _U64.unpack(body[1 + plen:9 + plen])
    return pos + 4 + n, producer, seq, body[9 + plen:-4]


class FilePublisher:
    """Appends records to the transport file; each publish is durable on return."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        self._scanned = 0
        self._last: dict[str, int] = {}
        self._lock = threading.Lock()
        with self._locked():
            self._scan(repair=True)

    def _locked(self) -> _Flock:
        return _Flock(self._fd)

    def _scan(self, *, repair: bool) -> None:
        """Read records from where we stopped; learn each producer's last seq.
        With ``repair``, cut a torn tail left by a publisher that died mid-write."""
        pos = self._scanned
        while True:
            rec = _read_record(self._fd, pos, self.path)
            if rec is None:
                break
            pos, producer, seq, _ = rec
            self._last[producer] = max(seq, self._last.get(producer, 0))
        self._scanned = pos
        size = os.fstat(self._fd).st_size
        if repair and size > pos:
            log.warning("transport file %s: cutting %d bytes of a torn record at offset %d "
                        "(a publisher died mid-write; that envelope was never acknowledged)",
                        self.path, size - pos, pos)
            os.ftruncate(self._fd, pos)
            os.fsync(self._fd)

    def last_sequence(self, producer_id: str) -> int:
        with self._lock, self._locked():
            self._scan(repair=False)
            return self._last.get(producer_id, 0)

    def publish(self, producer_id: str, seq: int, envelope: bytes, stop: threading.Event | None = None) -> None:
        record = _record(producer_id, seq, envelope)
        backoff = Backoff()
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._lock, self._locked():
                    self._append(producer_id, seq, envelope, record)
                return
            except OSError as exc:
                err = TransportUnavailableError(f"transport file {self.path} cannot be written: {exc.strerror}")
                if stop is not None and stop.is_set():
                    raise err from exc
                delay = backoff.next()
                log.warning("%s; retry %d in %.2fs", err.message, attempt, delay)
                if stop is None:
                    time.sleep(delay)
                elif stop.wait(delay):
                    raise err from exc

    def _append(self, producer_id: str, seq: int, envelope: bytes, record: bytes) -> None:
        self._scan(repair=True)  # other publishers may have appended
        if seq <= self._last.get(producer_id, 0):
            self._check_held(producer_id, seq, envelope)
            log.warning("transport file %s already holds envelope %d of %s (record checked); not written again",
                        self.path, seq, producer_id)
            return
        start = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, record)
            if written != len(record):
                raise OSError(0, f"short write ({written} of {len(record)} bytes)")
            os.fsync(self._fd)
        except OSError:
            # Leave no torn record behind for the retry to append after.
            os.ftruncate(self._fd, start)
            raise
        self._scanned = start + len(record)
        self._last[producer_id] = seq

    def _check_held(self, producer_id: str, seq: int, envelope: bytes) -> None:
        """Raise TransportStateAltered unless a record (producer, seq) holds
        ``envelope`` (bus.same_envelope).  The whole file is read (the
        records only chain forward), as the constructor does anyway; this
        runs only for a seq already there, which the producer does not send
        (it settles an envelope in flight at a crash from last_sequence)."""
        pos, other, below = 0, False, 0
        while pos < self._scanned:
            rec = _read_record(self._fd, pos, self.path)
            if rec is None:
                break
            pos, producer, rec_seq, stored = rec
            if producer != producer_id:
                continue
            if rec_seq == seq:
                if same_envelope(stored, envelope):
                    return
                other = True
            elif rec_seq < seq:
                below = max(below, rec_seq)
        last = self._last.get(producer_id, 0)
        seen = (f"its record numbered {seq} holds another envelope" if other
                else f"it holds no record numbered {seq} (the highest below is {below or 'none'})")
        raise TransportStateAltered(
            f"transport file {self.path} holds records of producer {producer_id!r} up to {last}, so envelope "
            f"{seq} counts as written, but {seen}: another writer appended to the file or it was edited; "
            f"nothing was written and the producer stops before skipping changes",
            hint="find who writes to the file; move it aside (or cut it after the last genuine record) "
                 "after checking, then restart the producer")

    def close(self) -> None:
        os.close(self._fd)


class _Flock:
    """flock(LOCK_EX) as a context manager: one writer at a time across processes."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)


class FileSubscriber:
    """Tails the transport file; the persisted offset moves on ack only."""

    def __init__(self, path: Path, consumer_name: str) -> None:
        self.path = Path(path)
        self.consumer = consumer_name
        self.offset_path = self.path.with_name(f"{self.path.name}.{consumer_name}.offset")
        self.dead_path = self.path.with_name(self.path.name + ".dead")
        committed, delivered = self._load_offset()
        self._committed = committed
        # Records below this offset were handed out by an earlier incarnation
        # (known at its last ack) and come back marked redelivered.
        self._delivered_before = delivered
        self._read_pos = committed
        self._outstanding: OrderedDict[int, int] = OrderedDict()  # start -> end, in file order
        self._acked: set[int] = set()
        self._fd: int | None = None
        # A damaged record at _read_pos: raised once what precedes it is acked.
        self._damage: CorruptTransportFile | None = None
        self._damage_seen_at = 0.0

    def _load_offset(self) -> tuple[int, int]:
        try:
            state = json.loads(self.offset_path.read_text())
            return int(state["offset"]), int(state["delivered"])
        except FileNotFoundError:
            return 0, 0
        except (ValueError, KeyError, TypeError) as exc:
            raise TerminalError(f"offset file {self.offset_path} is damaged: {exc}",
                                hint="delete it to re-read the transport file from the start "
                                     "(duplicates are skipped by sequence number)") from None

    def _open(self) -> int | None:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return None  # no publisher has written yet
            except OSError as exc:
                raise TransportUnavailableError(f"transport file {self.path} cannot be read: {exc.strerror}") from exc
        return self._fd

    def read(self, count: int, block_ms: int) -> list[Delivery]:
        deadline = time.monotonic() + block_ms / 1000.0
        while True:
            out = self._read_available(count)
            if out or time.monotonic() >= deadline:
                return out
            time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))

    def _read_available(self, count: int) -> list[Delivery]:
        if self._damage is not None:
            return self._stop_at_damage()
        fd = self._open()
        if fd is None:
            return []
        out: list[Delivery] = []
        while len(out) < count:
            try:
                rec = _read_record(fd, self._read_pos, self.path)
            except OSError as exc:
                raise TransportUnavailableError(f"transport file {self.path} cannot be read: {exc.strerror}") from exc
            except CorruptTransportFile as exc:
                # The valid records before the damage go out first (this
                # batch, and any still unacknowledged): the applier commits
                # them, then stops on the error.  Failing right here would
                # throw away the records read in this very call.
                self._damage = exc
                self._damage_seen_at = time.monotonic()
                log.error("%s; the %d records before it are applied first, then the applier stops",
                          exc.message, len(out) + len(self._outstanding))
                break
            if rec is None:
                break
            end, _, _, envelope = rec
            start = self._read_pos
            self._outstanding[start] = end
            out.append(Delivery(str(start), envelope, start < self._delivered_before))
            self._read_pos = end
        if not out and self._damage is not None:
            return self._stop_at_damage()
        return out

    def _stop_at_damage(self) -> list[Delivery]:
        assert self._damage is not None
        if not self._outstanding or time.monotonic() - self._damage_seen_at >= DAMAGE_GRACE_S:
            raise self._damage
        return []

    def ack(self, ids: Sequence[str]) -> None:
        if not ids:
            return
        for i in ids:
            start = int(i)
            if start not in self._outstanding:
                raise ValueError(f"ack of {i}: not a delivery of this subscriber")
            self._acked.add(start)
        # Only a contiguous acknowledged prefix may move the offset: a record
        # after an unacknowledged one must still be re-read after a restart.
        moved = False
        while self._outstanding:
            start, end = next(iter(self._outstanding.items()))
            if start not in self._acked:
                break
            self._outstanding.popitem(last=False)
            self._acked.discard(start)
            self._committed = end
            moved = True
        if moved:
            self._save_offset()

    def _save_offset(self) -> None:
        state = {"offset": self._committed, "delivered": max(self._read_pos, self._delivered_before)}
        tmp = self.offset_path.with_name(self.offset_path.name + ".tmp")
        try:
            with open(tmp, "w") as fh:
                json.dump(state, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.offset_path)
            fsync_dir(self.offset_path)
        except OSError as exc:
            raise TransportUnavailableError(
                f"offset file {self.offset_path} cannot be written: {exc.strerror}") from exc

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Append {id, reason, envelope (hex), at_ms} as a JSON line to
        ``<file>.dead`` (fsync'd), then acknowledge the delivery."""
        line = json.dumps({"id": delivery.id, "reason": reason, "consumer": self.consumer,
                           "at_ms": int(time.time() * 1000), "env": delivery.envelope.hex()})
        try:
            with open(self.dead_path, "a") as fh:
                fh.write(line + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise TransportUnavailableError(
                f"dead-letter file {self.dead_path} cannot be written: {exc.strerror}") from exc
        log.warning("dead-lettered record at offset %s of %s to %s: %s", delivery.id, self.path, self.dead_path, reason)
        self.ack([delivery.id])

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
