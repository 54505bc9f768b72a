"""The compiled Avro writer writes the reference encoder's bytes exactly."""
from __future__ import annotations

import datetime as dt
import decimal
import random

import pytest

from cynomys.core import compiled
from cynomys.core.columnar import ManyRows
from cynomys.core.errors import SchemaError
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, RawTemporal, TableSchema, Value
from cynomys.schemas import codec
from tests.unit.test_codec import VALUES, _batch

pytestmark = pytest.mark.skipif(not compiled.available(), reason="cynomys._speedups is not built")


def _compiled_bytes(batch: Batch, version: int = codec.VERSION) -> bytes:
    """The compiled writer alone (no fallback), so a test proves it ran."""
    ext = compiled._loaded
    assert ext is not None
    return ext.encode_batch(codec.MAGIC + bytes([version]), batch.producer_id, batch.end, batch.complete,
                            batch.first_txn, batch.created_us, batch.last_commit_ts, dict(batch.meta),
                            tuple(batch.changes), codec._op_index(), ManyRows)


def _random_value(rng: random.Random, kind: str) -> Value:
    if rng.random() < 0.15:
        return None
    if kind == "int":
        return rng.choice([rng.randint(-2**63, 2**63 - 1), rng.randint(-1000, 1000), 0])
    if kind == "bigint":
        return rng.randint(0, 2**64 - 1)
    if kind == "float":
        return rng.choice([rng.uniform(-1e300, 1e300), -0.0, float("inf"), rng.random()])
    if kind == "str":
        return "".join(rng.choice("ab\u00e9\U0001F600\x00 ,'") for _ in range(rng.randint(0, 40)))
    if kind == "bytes":
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40)))
    if kind == "decimal":
        return decimal.Decimal(rng.randint(-10**30, 10**30)).scaleb(-rng.randint(0, 30))
    if kind == "date":
        return dt.date(1, 1, 1) + dt.timedelta(days=rng.randint(0, 3652058))
    if kind == "zerodate":
        return rng.choice([dt.date(2020, 2, 29), RawTemporal("0000-00-00"), RawTemporal("2020-00-10")])
    if kind == "datetime":
        return dt.datetime(1, 1, 1) + dt.timedelta(microseconds=rng.randint(0, 315537897599999999))
    if kind == "timestamp":
        return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=rng.randint(1, 2**31 * 10**6))
    if kind == "time":
        return dt.timedelta(microseconds=rng.randint(-3020399999999, 3020399999999))
    if kind == "mixed":
        return _random_value(rng, rng.choice(["int", "bigint", "float", "str", "bytes", "decimal", "date", "zerodate",
                                              "datetime", "timestamp", "time"]))
    raise AssertionError(kind)


KINDS = ["int", "bigint", "float", "str", "bytes", "decimal", "date", "zerodate", "datetime", "timestamp", "time", "mixed"]


def random_batch(seed: int) -> Batch:
    rng = random.Random(seed)
    schemas = []
    for t in range(3):
        kinds = [rng.choice(KINDS) for _ in range(rng.randint(1, 8))]
        cols = tuple(ColumnDef(f"c{i}_{k}", k, rng.random() < 0.8) for i, k in enumerate(kinds))
        schemas.append((TableSchema("db", f"t{t}", cols, (cols[0].name,)), kinds))
    changes: list[Change] = []
    for i in range(rng.randint(0, 400)):
        schema, kinds = rng.choice(schemas)
        op = rng.choice([Op.INSERT, Op.UPDATE, Op.DELETE, Op.READ, Op.DDL])
        txn = Position("mysql-bin.000001", 4 + i, rng.choice(["", "0-1-%d" % i]))
        if op is Op.DDL:
            changes.append(Change(op, "db", "", f"0-1-{i}", txn, i, sql=f"ALTER TABLE t ADD c{i} int"))
            continue
        row = lambda: tuple(_random_value(rng, k) for k in kinds)  # noqa: E731
        before = row() if op in (Op.UPDATE, Op.DELETE) else None
        after = row() if op in (Op.INSERT, Op.UPDATE, Op.READ) else None
        # an equal schema from another object shares a table ref
        sch = TableSchema(schema.database, schema.table, schema.columns, schema.key) if rng.random() < 0.1 else schema
        changes.append(Change(op, "db", schema.table, f"0-1-{i}", txn, 1700000000 + i, sch, before, after,
                              rng.choice([None, "INSERT ..."])))
    meta = {"frag": str(seed)} if seed % 2 else {}
    return Batch(f"p{seed}", tuple(changes), Position("mysql-bin.000002", 77, "0-1-9"), bool(seed % 3),
                 changes[0].txn if changes else None, seed * 1000, 1700000000 + seed, meta)


def test_every_value_type_same_bytes() -> None:
    b = _batch(VALUES)
    assert _compiled_bytes(b) == codec.encode_pure(b)


@pytest.mark.parametrize("op", [Op.READ, Op.INSERT])
@pytest.mark.parametrize("seed", range(20))
def test_many_rows_give_the_bytes_of_their_changes(seed: int, op: Op) -> None:
    # A snapshot chunk's or a bulk insert's ManyRows (core/columnar.py)
    # among other changes: the compiled writer, the reference, and the
    # reference over its Changes write the same bytes; one without rows
    # writes none.
    b = random_batch(seed)
    rng = random.Random(seed)
    changes = list(b.changes)
    keyed = [c for c in changes if c.schema is not None and c.after is not None]
    for at in sorted(rng.sample(range(len(changes) + 1), min(3, len(changes) + 1)), reverse=True):
        src = rng.choice(keyed) if keyed else None
        if src is None:
            continue
        reads = tuple(c.after for c in keyed if c.schema == src.schema and c.after is not None)[:rng.randint(0, 50)]
        changes.insert(at, ManyRows(op, src.database, src.table, f"snapshot:{at}", src.txn, 5, src.schema,
                                    images=reads))
    chunked = Batch(b.producer_id, tuple(changes), b.end, b.complete, b.first_txn, b.created_us, b.last_commit_ts,
                    b.meta)
    expanded = Batch(b.producer_id, tuple(x for c in changes for x in (c.as_changes() if type(c) is ManyRows else [c])),
                     b.end, b.complete, b.first_txn, b.created_us, b.last_commit_ts, b.meta)
    got = _compiled_bytes(chunked)
    assert got == codec.encode_pure(chunked) == codec.encode_pure(expanded)
    assert codec.decode(got) == expanded


@pytest.mark.parametrize("seed", range(60))
def test_random_batches_same_bytes_and_round_trip(seed: int) -> None:
    b = random_batch(seed)
    got = _compiled_bytes(b)
    assert got == codec.encode_pure(b)
    assert codec.decode(got) == b


def test_unusual_values_fall_back_to_the_reference() -> None:
    cet = dt.timezone(dt.timedelta(hours=1))
    b = _batch([1, bytearray(b"ab"), dt.datetime(2020, 1, 1, tzinfo=cet)])
    assert codec.encode(b) == codec.encode_pure(b)  # via Fallback
    with pytest.raises(SchemaError, match="complex"):
        codec.encode(_batch([1, complex(1, 2)]))
    with pytest.raises(SchemaError, match="columns"):
        cols = (ColumnDef("a", "int"), ColumnDef("b", "int"))
        codec.encode(Batch("p", (Change(Op.INSERT, "d", "t", "x", Position("f", 4), 0, TableSchema("d", "t", cols, ("a",)),
                                        None, (1,)),), Position("f", 5)))


def test_a_keyless_tables_indexes_travel_in_v3_on_both_paths() -> None:
    # A keyless table's snapshot read carries the source's secondary
    # indexes (TableSchema.indexes): schema v3, the compiled writer's bytes
    # the reference's, both readers give them back; a batch without them
    # stays v1 and reads back without.
    cols = (ColumnDef("k", "int"), ColumnDef("s", "varchar(10)"), ColumnDef("d", "decimal(10,2)"))
    indexed = TableSchema("d", "t", cols, (), (("k",), ("s", "d")))
    plain = TableSchema("d", "u", cols, ())
    rows = tuple((i, f"s{i}", decimal.Decimal(i).scaleb(-2)) for i in range(50))
    b = Batch("p", (ManyRows(Op.READ, "d", "t", "snap", Position("f", 4), 5, indexed, images=rows),
                    Change(Op.INSERT, "d", "u", "x", Position("f", 4), 5, plain, None, rows[0]),
                    Change(Op.PURGE, "d", "t", "x", Position("f", 4), 5, sql="{}")),
              Position("f", 9))
    assert codec.writer_version(b) == codec.INDEXES
    got = _compiled_bytes(b, codec.INDEXES)
    assert got == codec.encode_pure(b) == codec.encode(b)
    assert got[:4] == b"CYB\x03"
    for read in (codec.decode, codec.decode_columnar):
        out = read(got)
        by_table = {c.table: c.schema for c in out.changes if c.schema is not None}
        assert by_table["t"].indexes == (("k",), ("s", "d")) and by_table["u"].indexes == ()
        assert by_table["t"] == indexed  # a hint, not the shape: equal either way
    assert [c.op for c in codec.decode(got).changes][-1] is Op.PURGE
    before = compiled.fallbacks["decode_columns"]
    codec.decode_columnar(got)
    assert compiled.fallbacks["decode_columns"] == before, "a v3 envelope left the compiled reader"
    without = Batch("p", b.changes[1:2], Position("f", 9))
    assert codec.encode(without)[:4] == b"CYB\x01"
    assert codec.decode(codec.encode(without)).changes[0].schema.indexes == ()
