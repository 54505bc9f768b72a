"""`cynomys verify` on the ColumnStore/MariaDB target: the checksum the
server computes in SQL equals the producer's Python checksum of the same
rows, for every type it renders in SQL (both type profiles: InnoDB, and
ColumnStore's mapping on InnoDB tables); key ranges are byte ranges whatever
the target column's collation (a repair is refused where deleting by key
would take other rows); and verify through the applier's PartitionTarget
wrapper reaches these SQL paths."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from cynomys.applier.partition import Partitioning, PartitionTarget
from cynomys.applier.targets.base import Target
from cynomys.applier.targets.columnstore import verify as cs_verify
from cynomys.applier.targets.columnstore.target import ColumnStoreTarget
from cynomys.core.model import ColumnDef, Op, TableSchema
from cynomys.verify.applier import Verifier, read_results
from cynomys.verify.checksum import KeyRange, RowHasher
from cynomys.verify.errors import RepairRefused
from tests.integration import target_contract as contract
from tests.integration.target_setups.columnstore import EmulatedColumnStore, columnstore_rows, make_config
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[MariaDBServer]:
    srv = MariaDBServer(server_id=8).start()
    yield srv
    srv.destroy()


@pytest.mark.parametrize("cls", [ColumnStoreTarget, EmulatedColumnStore], ids=["innodb", "columnstore-profile"])
def test_sql_checksum_equals_python_checksum(server: MariaDBServer, cls: type[ColumnStoreTarget]) -> None:
    db = f"vsql_{cls.__name__.lower()}"
    keep = [i for i, (_, t) in enumerate(contract.ALL_TYPES) if t not in ("float", "double")]
    schema = TableSchema(db, "t", tuple(ColumnDef(*contract.ALL_TYPES[i]) for i in keep), ("id",))
    source = contract.ALL_TYPES_ROWS if cls is ColumnStoreTarget else columnstore_rows()
    rows = [tuple(r[i] for i in keep) for r in source]
    target = cls(make_config(server.url))
    target.connect()
    try:
        target.apply(contract.flush([contract.change(Op.INSERT, schema, after=r) for r in rows]))
        hasher = RowHasher(schema.columns)
        assert cs_verify.checksum_sql(schema) is not None
        for i, r in enumerate(rows):  # one row at a time: a mismatch names the row
            got = cs_verify.checksum_range(target, schema, KeyRange((r[0] - 1,), (r[0],)))
            assert got == hasher.rows([r]), f"row {i}: {r!r}"
        whole = cs_verify.checksum_range(target, schema, KeyRange())
        assert whole == hasher.rows(rows) == target.checksum_range(schema, KeyRange())
        # a FLOAT column has no exact SQL text: the range is read back instead
        with_float = TableSchema(db, "t", schema.columns + (ColumnDef("f", "float"),), ("id",))
        assert cs_verify.checksum_sql(with_float) is None
    finally:
        target.close()


# -- key order on the target, and the wrapper the applier puts around it ------------------
KEYS = ["a", "B", "c", "D", "é", "f", "b\t", "x ", "Zz", "ñu"]   # distinct under general_ci too
TEXT_SCHEMA = (ColumnDef("k", "varchar(20)"), ColumnDef("v", "int"))
RANGES = [KeyRange(None, ("a",)), KeyRange(("a",), ("f",)), KeyRange(("f",), None), KeyRange(("B",), ("c",)),
          KeyRange(("D",), ("é",)), KeyRange(("b",), ("b\t",)), KeyRange(("x",), ("x ",))]


def _in(rng: KeyRange, rows: list[tuple]) -> list[tuple]:  # type: ignore[type-arg]
    return [r for r in rows if rng.contains((r[0],))]


def test_ranges_are_byte_ranges_whatever_the_target_collation(server: MariaDBServer) -> None:
    """A target key column in utf8mb4_general_ci ('a' < 'B', 'x' = 'x ')
    still answers for the byte range: the checksum in SQL and the rows read
    back are those Python's ``KeyRange.contains`` picks."""
    db = "vsql_ci"
    schema = TableSchema(db, "t", TEXT_SCHEMA, ("k",))
    rows = [(k, i) for i, k in enumerate(KEYS)]
    server.execute(f"CREATE DATABASE {db}",
                   f"CREATE TABLE {db}.t (k VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci PRIMARY KEY,"
                   " v INT) ENGINE=InnoDB")
    conn = server.connect(db)
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO t VALUES (%s, %s)", rows)
    conn.commit()
    conn.close()
    target = ColumnStoreTarget(make_config(server.url))
    target.connect()
    try:
        hasher = RowHasher(schema.columns)
        for rng in RANGES:
            want = _in(rng, rows)
            assert cs_verify.checksum_range(target, schema, rng) == hasher.rows(want), rng
            assert sorted(target.range_rows(schema, rng)) == sorted(want), rng
        with pytest.raises(RepairRefused) as exc:
            target.purge_into(contract.flush([]), schema, RANGES[1])
        line = exc.value.one_line()
        assert "\n" not in line and f"repair of {db}.t refused" in line and "key column k" in line
        assert "utf8mb4_general_ci" in line and "COLLATE utf8mb4_nopad_bin" in line, line
    finally:
        target.close()


def test_purge_deletes_exactly_the_byte_range(server: MariaDBServer) -> None:
    """On a table Cynomys made (utf8mb4_nopad_bin) a repair's deletion takes
    the byte range's keys and nothing else: 'B' < k <= 'c' holds 'D', 'a',
    'b\t' and 'c' (in utf8mb4_general_ci it would hold 'c' alone), not 'A'
    or 'é'."""
    db = "vsql_purge"
    schema = TableSchema(db, "t", TEXT_SCHEMA, ("k",))
    rows = [(k, i) for i, k in enumerate(KEYS + ["A", "x", "e"])]  # case and pad variants: distinct in bytes
    target = ColumnStoreTarget(make_config(server.url))
    target.connect()
    try:
        target.apply(contract.flush([contract.change(Op.INSERT, schema, after=r) for r in rows]))
        rng = KeyRange(("B",), ("c",))
        flush = contract.flush([])
        assert target.purge_into(flush, schema, rng) == len(_in(rng, rows))
        target.apply(flush)
        assert sorted(target.fetch_rows(db, "t")) == sorted(r for r in rows if not rng.contains((r[0],)))
    finally:
        target.close()


def test_verify_through_the_partition_wrapper_uses_the_sql_paths(server: MariaDBServer, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The applier wraps its target (applier/loop.py:
    ``PartitionTarget(target, Partitioning.of(cfg))``); a CHECKSUM and a
    repair through that wrapper reach the target's SQL paths, never the
    base class's read of the whole table."""
    db = "vsql_wrapped"
    cfg = make_config(server.url)
    cfg = dataclasses.replace(cfg, applier=dataclasses.replace(cfg.applier, state_dir=str(tmp_path)))
    schema = TableSchema(db, "t", TEXT_SCHEMA, ("k",))
    rows = [(f"k{i:04d}", i) for i in range(300)]
    calls = {"checksum_range": 0, "range_rows": 0}
    for name in calls:
        real = getattr(cs_verify, name)

        def counted(*a: Any, _real: Any = real, _name: str = name) -> Any:
            calls[_name] += 1
            return _real(*a)
        monkeypatch.setattr(cs_verify, name, counted)

    def whole_table(*a: Any) -> Any:
        raise AssertionError("verify fell back to reading the whole table")
    monkeypatch.setattr(Target, "range_rows", whole_table)
    monkeypatch.setattr(Target, "checksum_range", whole_table)
    monkeypatch.setattr(ColumnStoreTarget, "fetch_rows", whole_table)

    wrapped = PartitionTarget(ColumnStoreTarget(cfg), Partitioning.of(cfg))
    wrapped.connect()
    try:
        wrapped.apply(contract.flush([contract.change(Op.INSERT, schema, after=r) for r in rows]))
        verifier = Verifier(cfg, wrapped)
        rng = KeyRange(("k0099",), ("k0199",))
        good = RowHasher(schema.columns).rows(_in(rng, rows))
        payload = json.dumps({"job": "j", "chunk": "j/c/0", "range": rng.to_dict(), **good.to_dict()})
        verifier.check(dataclasses.replace(contract.change(Op.CHECKSUM, schema), sql=payload))
        assert calls == {"checksum_range": 1, "range_rows": 0}
        # a repair: PURGE, the range's rows, CHECKSUM -- the purge reads the range in SQL
        purge = dataclasses.replace(contract.change(Op.PURGE, schema), sql=payload)
        verifier.purge_later(purge)
        flush = contract.flush([contract.change(Op.READ, schema, after=r) for r in _in(rng, rows)])
        verifier.amend(flush)
        wrapped.apply(flush)
        assert calls["range_rows"] == 1 and verifier.stats["purged"] == 100
        verifier.check(dataclasses.replace(contract.change(Op.CHECKSUM, schema), sql=payload))
        results = read_results(tmp_path / "verify-results.jsonl")
        assert results["j/c/0"]["match"] and calls["checksum_range"] == 2
    finally:
        wrapped.close()


def test_source_row_hashes_in_sql_equal_the_python_hashes_of_snapshot_rows(server: MariaDBServer) -> None:
    """The producer selects a verify chunk as (key, row hash) pairs, the
    hash computed by the source (verify/sqlhash.py): for every column type
    it renders (zero dates, invalid dates, negative times, JSON, BIT, YEAR,
    binary, text in other charsets, NULLs), the hash equals the Python hash
    of the row as a snapshot reads it into the model."""
    from cynomys.core.config import SourceConfig
    from cynomys.snapshot.chunker import build_chunk_query
    from cynomys.snapshot.columns import row_converter
    from cynomys.snapshot.source import SnapshotConnection
    from cynomys.verify.sqlhash import row_hash_sql
    from tests.integration.test_producer import ALL_TYPES, ROWS

    db = "vsql_source"
    cols = ", ".join(f"`{n}` {t}" for n, t in ALL_TYPES if t not in ("float", "double"))
    keep = [i for i, (_, t) in enumerate(ALL_TYPES) if t not in ("float", "double")]
    server.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}",
                   f"CREATE TABLE {db}.t ({cols}) DEFAULT CHARSET=utf8mb4")
    conn = SnapshotConnection(SourceConfig(**server.source_settings()))
    try:
        server.execute("SET SESSION sql_mode=''", "SET SESSION time_zone='+00:00'",
                       *[f"INSERT INTO {db}.t VALUES ({', '.join(v for i, v in enumerate(_literals(r)) if i in keep)})"
                         for r in ROWS])
        schema = conn.describe(db, "t").schema
        expr = row_hash_sql(schema.columns)
        assert expr is not None
        q = build_chunk_query(db, "t", schema.columns, schema.key, None, 100)
        rows = [row_converter(schema.columns)(r) for r in conn.query(q.sql)]
        hashes = dict(conn.query(f"SELECT id, {expr} FROM {db}.t"))  # no parameters: % stays as it is
        hasher = RowHasher(schema.columns)
        assert len(rows) == len(ROWS)
        for r in rows:
            assert int(hashes[r[0]]) == hasher.row(r), f"row {r[0]}: {r!r}"
        with_float = TableSchema(db, "t", schema.columns + (ColumnDef("f", "float"),), ("id",))
        assert row_hash_sql(with_float.columns) is None
    finally:
        conn.close()


def _literals(row_sql: str) -> list[str]:
    """The comma-separated SQL literals of a ``(a, b, ...)`` VALUES tuple
    (commas inside quotes and parentheses kept)."""
    out, cur, depth, quote = [], "", 0, ""
    body = row_sql.strip()[1:-1]
    i = 0
    while i < len(body):
        ch = body[i]
        if quote:
            cur += ch
            if ch == "\\":
                cur += body[i + 1]
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote, cur = ch, cur + ch
        elif ch == "(":
            depth, cur = depth + 1, cur + ch
        elif ch == ")":
            depth, cur = depth - 1, cur + ch
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    out.append(cur.strip())
    return out
