"""Partitioned appliers, pure logic: the table -> partition hash, what each
partition takes from an envelope (rows and DDL), the config keys, the
progress delay of the buffer, and metrics labelled by partition."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cynomys.applier.batcher import DelayBuffer
from cynomys.applier.partition import CrossPartitionDdl, Partitioning, table_partition
from cynomys.core.config import load_config
from cynomys.core.errors import ConfigError
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, TableSchema
from cynomys.metrics import ApplierMonitor

N = 2


def _table_in(partition: int, prefix: str, partitions: int = N) -> str:
    """A table name of database ``app`` that hashes to ``partition``."""
    return next(f"{prefix}{i}" for i in range(1000) if table_partition("app", f"{prefix}{i}", partitions) == partition)


A0, B0 = _table_in(0, "a"), _table_in(0, "b")
A1 = _table_in(1, "c")


def _row(table: str, n: int) -> Change:
    schema = TableSchema("app", table, (ColumnDef("id", "int"),), ("id",))
    return Change(Op.INSERT, "app", table, f"t{n}", Position("b.000001", 100 + n), n, schema, None, (n,))


def _ddl(sql: str, n: int = 50, db: str = "app") -> Change:
    return Change(Op.DDL, db, "", f"t{n}", Position("b.000001", 100 + n), n, sql=sql)


def _batch(*changes: Change) -> Batch:
    return Batch("p1", tuple(changes), Position("b.000001", 999), complete=True, last_commit_ts=7,
                 meta={"from": "b.000001:100"})


def _taken(batch: Batch, partition: int, skip: tuple[str, ...] = ()) -> Batch:
    return Partitioning(N, partition, skip).select(batch)


def test_hash_is_crc32_of_db_dot_table_and_the_same_in_every_process() -> None:
    """Python's hash() of a str changes per process; the partition must not."""
    import zlib

    names = [("app", f"t{i}") for i in range(50)]
    here = [table_partition(db, t, 7) for db, t in names]
    assert here == [zlib.crc32(f"{db}.{t}".encode()) % 7 for db, t in names]
    code = ("from cynomys.applier.partition import table_partition; "
            "print([table_partition('app', f't{i}', 7) for i in range(50)])")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}, cwd=Path(__file__).parents[2])
        assert out.stdout.strip() == str(here)
    assert set(here) == set(range(7)), "50 tables should reach all 7 partitions"


def test_partitions_split_rows_disjointly_and_keep_the_envelope_bookkeeping() -> None:
    batch = _batch(_row(A0, 1), _row(A1, 2), _row(B0, 3), _row(A1, 4))
    p0, p1 = _taken(batch, 0), _taken(batch, 1)
    assert [c.table for c in p0.changes] == [A0, B0]
    assert [c.table for c in p1.changes] == [A1, A1]
    for part in (p0, p1):
        assert (part.end, part.complete, part.meta, part.last_commit_ts) == \
            (batch.end, batch.complete, batch.meta, batch.last_commit_ts)
    assert _taken(_batch(_row(A1, 1)), 0).changes == ()  # an envelope with nothing for p0: still taken, empty
    assert Partitioning(1, 0).select(batch) is batch  # unpartitioned: untouched


def test_ddl_goes_to_its_tables_partition() -> None:
    create = _ddl(f"CREATE TABLE {A1} (id INT PRIMARY KEY)")
    alter = _ddl(f"ALTER TABLE app.{A0} ADD COLUMN x INT")
    batch = _batch(_row(A0, 1), create, alter, _row(A1, 60))
    assert [c.op for c in _taken(batch, 0).changes] == [Op.INSERT, Op.DDL]
    assert _taken(batch, 0).changes[1] is alter
    assert _taken(batch, 1).changes == (create, batch.changes[3])


def test_statements_naming_no_table_go_to_every_partition() -> None:
    for sql in ("CREATE DATABASE app", "CREATE DATABASE IF NOT EXISTS app2"):
        batch = _batch(_ddl(sql, db=""))
        assert _taken(batch, 0).changes == batch.changes == _taken(batch, 1).changes


def test_drop_table_of_two_partitions_is_split() -> None:
    batch = _batch(_ddl(f"DROP TABLE IF EXISTS {A0}, app.{A1}, {B0}"))
    (d0,), (d1,) = _taken(batch, 0).changes, _taken(batch, 1).changes
    assert d0.sql == f"DROP TABLE IF EXISTS `app`.`{A0}`, `app`.`{B0}`"
    assert d1.sql == f"DROP TABLE IF EXISTS `app`.`{A1}`"
    assert d0.txn == d1.txn == batch.changes[0].txn


@pytest.mark.parametrize("sql", [f"RENAME TABLE {A0} TO {A1}", f"CREATE TABLE {A1} LIKE {A0}"])
def test_ddl_between_partitions_stops_the_partitions_involved(sql: str) -> None:
    batch = _batch(_ddl(sql))
    for p in (0, 1):
        with pytest.raises(CrossPartitionDdl, match="names tables of several partitions") as exc:
            _taken(batch, p)
        assert "skip_ddl" in (exc.value.hint or "")
    other = _table_in(2, "z", 3)  # with 3 partitions, a third one is not involved
    assert table_partition("app", other, 3) == 2
    third = Partitioning(3, 2).select(_batch(_ddl(f"RENAME TABLE {_table_in(0, 'a', 3)} TO {_table_in(1, 'c', 3)}")))
    assert third.changes == ()


def test_drop_database_stops_every_partition_unless_skipped() -> None:
    batch = _batch(_ddl("DROP DATABASE app"))
    for p in (0, 1):
        with pytest.raises(CrossPartitionDdl, match="drops database app"):
            _taken(batch, p)
    skipped = ("b.000001:150",)  # its position, as [applier] skip_ddl names it
    assert _taken(batch, 0, skipped).changes == batch.changes == _taken(batch, 1, skipped).changes


def test_ddl_that_cannot_be_parsed_goes_to_every_partition() -> None:
    """Its tables are unknown: every partition stops on it (the target's
    error names [applier] skip_ddl), as a single applier would."""
    batch = _batch(_ddl(f"ALTER TABLE {A1} DROP PARTITION p0"))
    assert _taken(batch, 0).changes == batch.changes == _taken(batch, 1).changes


def test_names_per_partition() -> None:
    p = Partitioning(3, 1)
    assert (p.state_key("p1"), p.group("g"), p.groups("g"), p.consumer("a"), p.file_name("applier")) == \
        ("p1#p1", "g.p1", ["g.p0", "g.p1", "g.p2"], "a.p1", "applier.p1.json")
    one = Partitioning(1, 0)
    assert (one.state_key("p1"), one.group("g"), one.groups("g"), one.consumer("a"), one.file_name("applier")) == \
        ("p1", "g", ["g"], "a", "applier.json")


def _cfg(tmp_path: Path, applier: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(f"[applier]\nstate_dir = \"{tmp_path}\"\n{applier}\n")
    return p


def test_config_keys(tmp_path: Path) -> None:
    cfg = load_config(_cfg(tmp_path, "partitions = 4\npartition = 3"), env={})
    assert (cfg.applier.partitions, cfg.applier.partition, cfg.applier.progress_interval_ms) == (4, 3, 5000)
    env = load_config(_cfg(tmp_path, "partitions = 4"), env={"CYNOMYS_APPLIER_PARTITION": "2"})
    assert env.applier.partition == 2
    with pytest.raises(ConfigError, match=r"\[applier\] partition = 4 is outside partitions = 4: expected 0 \.\. 3"):
        load_config(_cfg(tmp_path, "partitions = 4\npartition = 4"), env={})
    with pytest.raises(ConfigError, match=r"\[applier\] partitions .*positive"):
        load_config(_cfg(tmp_path, "partitions = 0"), env={})
    with pytest.raises(ConfigError, match=r"\[applier\] partition .*>= 0"):
        load_config(_cfg(tmp_path, "partitions = 2\npartition = -1"), env={})


def test_envelopes_without_changes_wait_for_the_progress_delay() -> None:
    buf = DelayBuffer(100, 0.0, progress_delay_s=60.0)
    buf.add([])
    buf.mark(Position("b.000001", 10), True, 0)
    assert not buf.due() and buf.wait_s() > 0  # only progress: no target write yet, and no busy loop
    buf.add([_row(A0, 1)])
    buf.mark(Position("b.000001", 20), True, 0)
    assert buf.due()  # data: the usual max_delay
    plain = DelayBuffer(100, 0.0)
    plain.mark(Position("b.000001", 10), True, 0)
    assert plain.due()  # unpartitioned: unchanged


def test_metrics_carry_the_partition(tmp_path: Path) -> None:
    cfg = load_config(_cfg(tmp_path, "partitions = 2\npartition = 1"), env={})
    mon = ApplierMonitor(cfg)
    mon.rows_in.labels("app.t").inc(3)
    mon.envelopes.inc()
    r = mon.registry
    assert r.get_sample_value("cynomys_applier_rows_in_total", {"table": "app.t", "partition": "1"}) == 3
    assert r.get_sample_value("cynomys_applier_envelopes_total", {"partition": "1"}) == 1
    assert r.get_sample_value("cynomys_applier_envelopes_total", {}) is None
    assert mon.report_path.name == "applier.p1.health.json"
    single = ApplierMonitor(load_config(_cfg(tmp_path, ""), env={}))
    single.envelopes.inc()
    assert single.registry.get_sample_value("cynomys_applier_envelopes_total", {}) == 1


def _public_target_methods() -> dict[str, object]:
    """Every public method and property of the Target interface (its own
    and what it inherits, ``object``'s aside)."""
    from cynomys.applier.targets.base import Target

    out: dict[str, object] = {}
    for klass in reversed(Target.__mro__[:-1]):
        for name, value in vars(klass).items():
            if not name.startswith("_") and (callable(value) or isinstance(value, property)):
                out[name] = value
    return out


def test_partition_target_forwards_every_method_of_target() -> None:
    """The applier always wraps its target in a PartitionTarget: a method it
    does not define runs the base-class default instead of the target's own
    (verify read whole tables per chunk that way).  Adding a method to
    Target without forwarding it fails here."""
    from cynomys.applier.partition import PartitionTarget

    methods = _public_target_methods()
    assert {"range_rows", "checksum_range", "purge_into", "apply", "fetch_rows"} <= set(methods)
    missing = sorted(n for n in methods if n not in vars(PartitionTarget))
    assert not missing, f"PartitionTarget does not forward {missing}"


def test_partition_target_calls_reach_the_wrapped_target(tmp_path: Path) -> None:
    """Each forwarded method reaches the wrapped target's own override with
    the same arguments (the state-keeping ones translate the producer id)."""
    import inspect

    from cynomys.applier.partition import PartitionTarget
    from cynomys.applier.targets.base import Flush, Target
    from cynomys.core.model import AppliedState

    cfg = load_config(_cfg(tmp_path, ""), env={})
    calls: list[str] = []

    def recorder(name: str) -> object:
        def method(self: object, *args: object, **kw: object) -> object:
            calls.append(name)
            return {"applied": None, "table_exists": True, "ddl_ops": [], "housekeeping": {},
                    "fetch_rows": [], "range_rows": [], "purge_into": 0}.get(name)
        return method

    methods = _public_target_methods()
    body = {n: recorder(n) for n, v in methods.items() if not isinstance(v, property)}
    for name, value in methods.items():  # where, parts_open
        if isinstance(value, property):
            body[name] = property(lambda self: "inner")
    Inner = type("Inner", (Target,), body)
    wrapped = PartitionTarget(Inner(cfg), Partitioning(1, 0))
    schema = TableSchema("app", "t", (ColumnDef("id", "int"),), ("id",))
    state = AppliedState("p1", 1, Position("b.000001", 4))
    args: dict[str, tuple[object, ...]] = {
        "applied": ("p1",), "recover": ("p1",), "apply": (Flush([], state),), "apply_ddl": (_ddl("CREATE DATABASE x"), state),
        "ddl_ops": (_ddl("CREATE DATABASE x"),), "table_exists": ("app", "t"), "fetch_rows": ("app", "t"),
        "table_columns": ("app", "t"),
        "range_rows": (schema, None), "checksum_range": (schema, None), "purge_into": (Flush([], state), schema, None),
        "apply_part": (Flush([], state),), "commit_parts": (Flush([], state),),
    }
    for name, value in methods.items():
        if isinstance(value, property):
            assert getattr(wrapped, name) == "inner"
            continue
        n_params = len(inspect.signature(value).parameters) - 1  # type: ignore[arg-type]
        getattr(wrapped, name)(*args.get(name, ())[:n_params])
    # connect also checks the partition layout through the wrapped target (applied/apply)
    assert set(calls) >= {n for n, v in methods.items() if not isinstance(v, property)}
