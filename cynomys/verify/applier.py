"""The applier's side of `cynomys verify`: CHECKSUM and PURGE records.

The loop hands a verification record over only once every change before it
in the stream is committed on the target (it flushes first, as before a
DDL), and before anything after it is applied; so the target's key range is
in the state the source's was at the record's position, and the two
checksums must be equal.

- CHECKSUM: the target computes the checksum of the key range
  (``Target.checksum_range``: in SQL where the target can, else the range's
  rows read back and hashed in Python, verify/checksum.py); the result is
  appended to ``<applier state_dir>/verify-results.jsonl``, one JSON object
  per line (the last line of a chunk id wins), which `cynomys verify` and
  `cynomys status` read without a target connection.
- PURGE (a repair): the range's READ rows follow it, then its CHECKSUM.
  The rows the target holds in the range are deleted in the same target
  transaction that inserts those READ rows and records the applier state,
  committed when the CHECKSUM comes; then the range is checked.  A target
  that cannot delete exactly the range (``RepairRefused``: a key column in
  a case-insensitive collation there) leaves it as it is: the READ rows are
  dropped from that transaction, the result carries the reason and the fix
  (``error``), and replication goes on.

The producer ends an envelope with each CHECKSUM record, so that commit
records the envelope's own state (its sequence number, its end): a state
later than any flush before it, which matters to targets that recognise a
flush they already hold by its state (Spark/Iceberg).  Replayed after a
crash, everything from the PURGE on comes again: the same end state.  A
crash after that commit but before the result is written leaves the chunk
without a result (the envelope is then a duplicate): `cynomys verify`
reports it as unchecked once ``--timeout`` passes; run it again.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cynomys.core.config import Config
from cynomys.core.errors import TerminalError
from cynomys.core.model import Change, Op, TableSchema
from cynomys.verify.checksum import Checksum, KeyRange
from cynomys.verify.errors import RepairRefused

if TYPE_CHECKING:  # the applier's types; verify sits below the applier
    from cynomys.applier.targets.base import Flush, Target

log = logging.getLogger(__name__)

RESULTS_FILE = "verify-results.jsonl"
VERIFY_OPS = frozenset({Op.CHECKSUM, Op.PURGE})


def results_path(cfg: Config) -> Path:
    return cfg.resolve(cfg.applier.state_dir) / RESULTS_FILE


def read_results(path: Path) -> dict[str, dict[str, Any]]:
    """chunk id -> its latest result (a torn last line is ignored)."""
    out: dict[str, dict[str, Any]] = {}
    try:
        with open(path) as fh:
            for line in fh:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if isinstance(r, dict) and "chunk" in r:
                    out[str(r["chunk"])] = r
    except FileNotFoundError:
        pass
    return out


def _schema(change: Change) -> TableSchema:
    if change.schema is None:
        raise TerminalError(f"a {change.op.value} record ({change.tid}) carries no table definition",
                            hint="producer and applier must run the same Cynomys version")
    return change.schema


def _payload(change: Change) -> dict[str, Any]:
    try:
        d = json.loads(change.sql or "")
        KeyRange.from_dict(d["range"])
        return d  # type: ignore[no-any-return]
    except (ValueError, KeyError, TypeError) as exc:
        raise TerminalError(f"a {change.op.value} record of {change.database}.{change.table} ({change.tid}) "
                            f"carries no readable payload: {exc}",
                            hint="producer and applier must run the same Cynomys version") from None


class Verifier:
    def __init__(self, cfg: Config, target: Target) -> None:
        self.target = target
        self.path = results_path(cfg)
        self.stats = {"checked": 0, "mismatched": 0, "purged": 0}
        self.purges: list[Change] = []   # PURGE records waiting for their CHECKSUM's flush
        self.refused: dict[str, str] = {}  # chunk id -> why the target refused its repair

    def purge_later(self, change: Change) -> None:
        _schema(change)
        _payload(change)
        self.purges.append(change)

    def amend(self, flush: Flush) -> None:
        """Add the waiting purges' deletions to ``flush`` (the one holding
        the ranges' READ rows)."""
        for change in self.purges:
            schema = _schema(change)
            d = _payload(change)
            rng = KeyRange.from_dict(d["range"])
            try:
                n = self.target.purge_into(flush, schema, rng)
            except RepairRefused as exc:
                # The flush holds the range's READ rows (they follow the PURGE,
                # and everything before it was committed): without the
                # deletion they must not go in either.
                flush.tables = [tf for tf in flush.tables
                                if (tf.schema.database, tf.schema.table) != (schema.database, schema.table)]
                self.refused[str(d.get("chunk"))] = exc.one_line()
                log.error("verify repair: %s (%s) left as it is: %s", schema.name, rng.describe(schema.key),
                          exc.one_line())
                continue
            self.stats["purged"] += n
            log.info("verify repair: %s (%s): replacing %d target rows with the source's", schema.name,
                     rng.describe(schema.key), n)
        self.purges = []

    def check(self, change: Change) -> None:
        """One CHECKSUM record; everything before it is committed."""
        schema = _schema(change)
        d = _payload(change)
        rng = KeyRange.from_dict(d["range"])
        t0 = time.monotonic()
        got = self.target.checksum_range(schema, rng)
        want = Checksum.from_dict(d)
        match = got == want
        self.stats["checked"] += 1
        if not match:
            self.stats["mismatched"] += 1
            log.warning("verify: %s %s differs: source %d rows (hash %016x), target %d rows (hash %016x)",
                        schema.name, rng.describe(schema.key), want.count, want.hash, got.count, got.hash)
        # "table": the source table (a repair reads it again); the target's
        # may be another name ([shape] routes).
        result = {"job": d.get("job"), "chunk": d.get("chunk"), "table": d.get("source") or schema.name,
                  "target_table": schema.name, "key": list(schema.key),
                  "range": d["range"], "describe": rng.describe(schema.key), "repair": bool(d.get("repair")),
                  "source": want.to_dict(), "target": got.to_dict(), "match": match,
                  "position": str(change.txn), "checked": time.time(),
                  "seconds": round(time.monotonic() - t0, 4)}
        refused = self.refused.pop(str(d.get("chunk")), "")
        if refused:
            result["error"] = refused
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(result, default=str, separators=(",", ":")) + "\n")
