"""[shape] from the command line: `cynomys config check` offline and against
the source's tables (merges of tables with different keys or column types
refused, naming both), and `cynomys tail` showing records as shaped (the
producer shapes them: routed names, masked values, filtered rows)."""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from cynomys.core.config import RouteRule, ShapeConfig, TableRule
from cynomys.core.model import ColumnDef, TableSchema
from cynomys.shape import compile_rules
from cynomys.shape.check import check_sources
from tests.helpers import write_config
from tests.integration.test_cli import cli
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration
KEY = "cli-shape-key-0123456789"


def _t(db: str, table: str, cols: str, key: tuple[str, ...] = ("id",)) -> TableSchema:
    return TableSchema(db, table, tuple(ColumnDef(*c.split(":")) for c in cols.split(";")), key)


def test_check_sources_names_both_tables_of_a_bad_merge() -> None:
    rules = compile_rules(ShapeConfig(route=[RouteRule("s*.o", "m.o")], tables={"s*.o": TableRule(exclude=["x"])}))
    good = check_sources(rules, [_t("s1", "o", "id:int;v:int"), _t("s2", "o", "id:int;v:int;w:int")])
    assert not good.errors and "w" in good.notes[0] and good.tables == 2
    keys = check_sources(rules, [_t("s1", "o", "id:int;v:int"), _t("s2", "o", "id:int;v:int", ("id", "v"))])
    assert "s1.o and s2.o" in keys.errors[0] and "different primary keys" in keys.errors[0]
    types = check_sources(rules, [_t("s1", "o", "id:int;v:int"), _t("s2", "o", "id:int;v:bigint")])
    assert "s1.o and s2.o" in types.errors[0] and "column v is int in one and bigint" in types.errors[0]
    keyless = check_sources(rules, [_t("s1", "o", "id:int", ())])
    assert "no primary key" in keyless.errors[0]
    # A table routed onto another that is not merged: two writers of one table.
    one = compile_rules(ShapeConfig(route=[RouteRule("a.t", "b.t")]))
    clash = check_sources(one, [_t("a", "t", "id:int"), _t("b", "t", "id:int")])
    assert "a.t and b.t both land on b.t" in clash.errors[0]


def _config(tmp_path: Path, server: MariaDBServer, shape: dict[str, Any], **extra: Any) -> Path:
    return write_config(tmp_path / "c.toml", server, shape=shape, **extra)


def test_config_check_offline_and_against_the_source(mariadb: MariaDBServer, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:6]
    a, b = f"sh{run}_1", f"sh{run}_2"
    mariadb.execute(f"CREATE DATABASE {a}", f"CREATE DATABASE {b}",
                    f"CREATE TABLE {a}.o (id INT PRIMARY KEY, v INT)", f"CREATE TABLE {b}.o (id INT, v INT, PRIMARY KEY (id, v))")
    shape = {"route": [{"source": f"sh{run}_*.o", "target": f"m{run}.o"}]}
    cfg = _config(tmp_path, mariadb, shape, source={"include_tables": [f"sh{run}_*.*"]})
    p = cli("config", "check", "-c", str(cfg), check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"{a}.o and {b}.o are merged into m{run}.o with different primary keys" in p.stderr
    off = cli("config", "check", "-c", str(cfg), "--offline")
    assert "checked offline only (--offline)" in off.stdout
    mariadb.execute(f"ALTER TABLE {b}.o DROP PRIMARY KEY, ADD PRIMARY KEY (id)")
    ok = cli("config", "check", "-c", str(cfg)).stdout
    assert "OK" in ok and "checked against the source's 2 replicated tables" in ok
    # What the file alone says is wrong is found offline, naming the key.
    bad = _config(tmp_path, mariadb, {"tables": {"a.b": {"mask": {"c": "sha1"}}}})
    p = cli("config", "check", "-c", str(bad), "--offline", check=False)
    assert p.returncode == 2 and '[shape.tables."a.b"] mask c: unknown mask' in p.stderr
    hashed = _config(tmp_path, mariadb, {"tables": {"a.b": {"mask": {"c": "hash"}}}})
    assert "mask_key is not set here" in cli("config", "check", "-c", str(hashed), "--offline").stdout


def test_tail_shows_records_as_shaped(mariadb: MariaDBServer, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:6]
    db = f"tl{run}"
    keys = tmp_path / "keys"
    cli("keygen", "--out", str(keys), "--bits", "2048")
    start = "{}:{}".format(*mariadb.execute("SHOW MASTER STATUS")[0][:2])
    cfg = _config(tmp_path, mariadb,
                  {"mask_key": KEY, "route": [{"source": f"{db}.people", "target": f"{db}_out.persons"}],
                   "tables": {f"{db}.people": {"mask": {"email": "hash:16"}, "exclude": ["notes"],
                                               "filter": "tenant = 1"}}},
                  source={"include_tables": [f"{db}.*"], "start": start},
                  transport={"kind": "file", "path": str(tmp_path / "t.bin")},
                  security={k: str(keys / f"{k.replace('_key', '')}.pem") for k in
                            ("applier_public_key", "producer_private_key", "applier_private_key", "producer_public_key")})
    mariadb.execute(f"CREATE DATABASE {db}",
                    f"CREATE TABLE {db}.people (id INT PRIMARY KEY, email VARCHAR(80), notes TEXT, tenant INT)",
                    f"INSERT INTO {db}.people VALUES (1, 'ann@x.org', 'secret note', 1), (2, 'bob@x.org', 'n', 2)")
    cli("produce", "-c", str(cfg), "--once")  # to the binlog's end, then exits
    tail = cli("tail", "-c", str(cfg)).stdout
    assert f"INSERT INTO `{db}_out`.`persons` (`id`, `email`, `tenant`) VALUES" in tail, tail
    assert "CREATE TABLE `" + db + "_out`.`persons` (`id` int NOT NULL, `email` char(16)" in tail
    for plain in ("ann@x.org", "bob@x.org", "secret note"):
        assert plain not in tail
    assert "(2, " not in tail  # tenant 2 is filtered out
