"""The applied state: what a target records per producer, and its one codec.

Every target keeps, next to its tables and committed with them, one record
per producer (``AppliedState``): the envelope sequence number, the source
position (binlog file, offset, GTID set), the source time of the last
applied transaction, and its lineage (source server, producer incarnation,
HA fence; applier/admit.py reads them).  Where the record lives differs --
a row of the table ``cynomys_state.applied`` on SQL targets (targets/sql.py),
a table property of the Iceberg table ``cynomys_state.applied`` on Spark
(targets/spark/target.py) -- what is in it, and how it is encoded and
decoded, is here and nowhere else:

- ``FIELDS``: the stored fields in order (one SQL column each, one JSON key
  each in a Spark property; ``producer_id`` is the record's key);
- ``encode``/``decode``: an AppliedState to those values and back (lineage as
  one JSON text, which states written before it existed lack);
- ``to_json``/``from_json``: the same values as one JSON object (Spark);
- ``as_text``/``from_text``: as strings (the Spark flush marker in Iceberg
  snapshot summaries, which carry text only);
- ``order`` and ``same_flush``: how two states of one producer compare.

The rule that what a target records never moves back is the applier's
(admit.py: the recorded sequence number is the highest taken, ``hwm``);
a target stores what it is given.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from cynomys.core.errors import TargetRejectedError
from cynomys.core.model import AppliedState, Position

#: Where the state lives on every target: schema/database/namespace and table.
NAMESPACE = "cynomys_state"
TABLE = "applied"

#: The record's key, then what is stored per producer, in order.  A SQL
#: state table has one column each (plus ``updated_at``, the time of the
#: write, for people); a Spark state property one JSON key each.
KEY = "producer_id"
FIELDS: tuple[str, ...] = ("seq", "file", "pos", "gtid", "commit_ts", "lineage")
#: Fields added after the first version: a state table created before them
#: gets the column when a target connects; their value may be missing.
ADDED_LATER: tuple[str, ...] = ("lineage",)
#: A SQL state table's column holding the time of the write (for people).
WRITTEN_AT = "updated_at"
#: A SQL state table's columns, in the order tables have always had.
COLUMNS: tuple[str, ...] = (KEY, *(f for f in FIELDS if f not in ADDED_LATER), WRITTEN_AT, *ADDED_LATER)

Values = tuple[Any, ...]


def lineage_json(state: AppliedState) -> str:
    """The identity fields as one JSON text (the ``lineage`` field)."""
    return json.dumps({"server": state.server, "incarnation": state.incarnation, "fence": state.fence},
                      sort_keys=True)


def lineage_of(text: object) -> dict[str, Any]:
    """``lineage_json``'s fields back ({} for a state written before they existed)."""
    if not text:
        return {}
    data = json.loads(str(text))
    return {"server": str(data.get("server", "")), "incarnation": str(data.get("incarnation", "")),
            "fence": int(data.get("fence", 0))}


def encode(state: AppliedState) -> Values:
    """The stored values of ``state``, in ``FIELDS`` order."""
    p = state.position
    return (state.seq, p.file, p.pos, p.gtid, state.commit_ts, lineage_json(state))


def decode(producer_id: str, values: Sequence[Any]) -> AppliedState:
    """``encode``'s values (as a driver returns them) back into a state."""
    seq, file, pos, gtid, commit_ts, lineage = values
    return AppliedState(producer_id, int(seq), Position(str(file), int(pos), str(gtid or "")), int(commit_ts or 0),
                        **lineage_of(lineage))


def to_json(state: AppliedState) -> str:
    """The stored values as one JSON object.  Its shape is the one Spark
    targets have always written (the position as an object), so states
    written by earlier versions read back, and this one by them."""
    seq, file, pos, gtid, commit_ts, lineage = encode(state)
    return json.dumps({"seq": seq, "position": {"file": file, "pos": pos, "gtid": gtid}, "commit_ts": commit_ts,
                       "lineage": lineage})


def from_json(producer_id: str, text: str, where: str = "the target") -> AppliedState:
    """``to_json``'s text back into a state."""
    try:
        d = json.loads(text)
        p = d["position"]
        return decode(producer_id, (d["seq"], p["file"], p["pos"], p.get("gtid", ""), d.get("commit_ts", 0),
                                    d.get("lineage")))
    except (ValueError, KeyError, TypeError) as exc:
        raise TargetRejectedError(f"the applier state of producer {producer_id} on {where} cannot be read: "
                                  f"{text[:200]!r} ({type(exc).__name__}: {exc})",
                                  hint="restore it from a backup, or remove it and re-snapshot the tables") from None


def as_text(state: AppliedState) -> dict[str, str]:
    """The key and the stored values but the lineage, as strings."""
    values = dict(zip(FIELDS, encode(state)))
    values.pop("lineage")
    return {KEY: state.producer_id, **{k: str(v) for k, v in values.items()}}


def from_text(fields: Mapping[str, str]) -> AppliedState:
    """``as_text``'s strings back (gtid and commit_ts may be missing)."""
    return decode(fields[KEY], (fields["seq"], fields["file"], fields["pos"], fields.get("gtid", ""),
                                fields.get("commit_ts", "0"), None))


def order(state: AppliedState) -> tuple[int, tuple[int, str, int]]:
    """States of one producer grow in (seq, position); a DDL keeps its
    envelope's previous seq but moves the position."""
    return (state.seq, state.position.sort_key())


def same_flush(a: AppliedState, b: AppliedState) -> bool:
    """Whether two states name the same flush (lineage aside)."""
    return a.seq == b.seq and a.position == b.position
