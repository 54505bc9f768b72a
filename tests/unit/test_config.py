"""Configuration: defaults, validation naming key and file, env overrides, redaction."""
from __future__ import annotations

from pathlib import Path

import pytest

from cynomys.applier.targets.columnstore.config import ColumnStoreConfig
from cynomys.applier.targets.spark.config import SparkConfig
from cynomys.core.config import load_config
from cynomys.core.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_contract_keys_load(tmp_path: Path) -> None:
    p = write(tmp_path, """
[source]
host = "db"
port = 3307
user = "u"
password = "pw"
server_id = 99
include_tables = ["shop.*"]
exclude_tables = ["shop.tmp_*"]
[producer]
id = "p"
state_dir = "st"
batch_max_events = 10
batch_max_delay_ms = 5
[transport]
kind = "file"
url = "redis://x"
stream = "s"
mode = "pubsub"
path = "t.bin"
[security]
applier_public_key = "a.pub"
producer_private_key = "p.key"
applier_private_key = "a.key"
producer_public_key = "p.pub"
[applier]
buffer_rows = 7
max_delay_ms = 8
state_dir = "ast"
[target]
kind = "columnstore"
url = "mysql://u:p@h:1/"
engine = "InnoDB"
[target.spark]
master = "spark://m:7077"
warehouse = "/w"
catalog = "c"
conf = { "spark.executor.memory" = "1g" }
""")
    cfg = load_config(p, env={})
    assert cfg.source.port == 3307 and cfg.source.include_tables == ["shop.*"]
    assert cfg.transport.mode == "pubsub" and cfg.applier.buffer_rows == 7
    assert cfg.target.of(SparkConfig).conf == {"spark.executor.memory": "1g"}
    assert cfg.target.of(ColumnStoreConfig).engine == "InnoDB"
    assert cfg.resolve(cfg.producer.state_dir) == tmp_path / "st"
    assert "pw" not in repr(cfg) and "u:p@" not in repr(cfg)


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    p = write(tmp_path, "[source]\nhots = 'x'\n")
    with pytest.raises(ConfigError, match=r"unknown key \[source\] hots in .*c\.toml"):
        load_config(p, env={})


def test_unknown_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key \[\] sauce|unknown key .*sauce"):
        load_config(write(tmp_path, "[sauce]\na = 1\n"), env={})


@pytest.mark.parametrize("text,match", [
    ("[source]\nport = 'x'\n", r"\[source\] port in .*: expected an integer"),
    ("[source]\nport = 70000\n", r"\[source\] port .*TCP port"),
    ("[transport]\nmode = 'queue'\n", r"\[transport\] mode .*one of 'stream', 'pubsub'"),
    ("[target]\nkind = 'oracle'\n", r"\[target\] kind"),
    ("[applier]\nbuffer_rows = 0\n", r"\[applier\] buffer_rows .*positive"),
    ("[source]\ninclude_tables = 'a.*'\n", r"expected a list of strings"),
])
def test_bad_values(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(write(tmp_path, text), env={})


def test_secrets_from_environment(tmp_path: Path) -> None:
    p = write(tmp_path, "[source]\nuser = 'u'\n")
    cfg = load_config(p, env={"CYNOMYS_SOURCE_PASSWORD": "s3cret", "CYNOMYS_TARGET_URL": "mysql://a:b@c/",
                              "CYNOMYS_TARGET_SPARK_MASTER": "local[2]", "CYNOMYS_SOURCE_PORT": "3310"})
    assert cfg.source.password == "s3cret" and cfg.target.url == "mysql://a:b@c/"
    assert cfg.target.of(SparkConfig).master == "local[2]" and cfg.source.port == 3310
    assert "s3cret" not in repr(cfg)
    with pytest.raises(ConfigError, match="CYNOMYS_SOURCE_PORT"):
        load_config(p, env={"CYNOMYS_SOURCE_PORT": "many"})


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml", env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[source\n"), env={})


# --- issue #13: unreadable configs and leaked secrets -------------------------

def test_a_directory_or_non_utf8_config_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory") as ei:
        load_config(tmp_path)
    assert ei.value.hint is not None
    latin = tmp_path / "latin1.toml"
    latin.write_bytes('[source]\nuser = "r\xe9plica"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="is not UTF-8") as ei:
        load_config(latin)
    assert ei.value.hint is not None and "UTF-8" in ei.value.hint


@pytest.mark.parametrize("text", ['[source]\npassword = 12345678\n', '[transport]\nurl = ["redis://:hunter2@h"]\n',
                                  '[target]\nurl = { pw = "hunter2" }\n'])
def test_a_secret_of_the_wrong_type_is_not_echoed(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match="expected a string") as ei:
        load_config(write(tmp_path, text))
    assert "12345678" not in str(ei.value) and "hunter2" not in str(ei.value)


def test_environment_type_errors_name_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="CYNOMYS_SOURCE_PORT") as ei:
        load_config(write(tmp_path, ""), env={"CYNOMYS_SOURCE_PORT": "hunter2"})
    assert "hunter2" in str(ei.value)  # not a secret: shown, so the user sees the typo
    with pytest.raises(ConfigError, match="CYNOMYS_SECURITY_ALLOW_READABLE_PRIVATE_KEYS"):
        load_config(write(tmp_path, ""), env={"CYNOMYS_SECURITY_ALLOW_READABLE_PRIVATE_KEYS": "maybe"})


def test_source_tls_files_are_resolved_against_the_config_file(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, '[source]\nssl_ca = "tls/ca.pem"\nssl_cert = "/etc/c.pem"\n'
                                      '[transport]\nmax_envelope_bytes = 1048576\n'))
    assert cfg.source.ssl_ca == str(tmp_path / "tls" / "ca.pem")
    assert cfg.source.ssl_cert == "/etc/c.pem" and cfg.source.ssl_key == ""
    assert cfg.transport.max_envelope_bytes == 1048576
    with pytest.raises(ConfigError, match="max_envelope_bytes"):
        load_config(write(tmp_path, "[transport]\nmax_envelope_bytes = 0\n"))


# --- each target's settings live in its folder (issue #23) -------------------

def test_target_settings_are_validated_where_they_always_were(tmp_path: Path) -> None:
    """``[target] engine`` and ``[target.spark]`` are read by their targets'
    classes (targets/<kind>/config.py) yet refused, overridden and named
    like any other key."""
    with pytest.raises(ConfigError, match=r"unknown key \[target\.spark\] mastr in .*c\.toml") as ei:
        load_config(write(tmp_path, "[target.spark]\nmastr = 'local'\n"), env={})
    assert ei.value.hint is not None and "master" in ei.value.hint
    with pytest.raises(ConfigError, match=r"unknown key \[target\] engin ") as ei:
        load_config(write(tmp_path, "[target]\nengin = 'InnoDB'\n"), env={})
    assert ei.value.hint is not None and "engine" in ei.value.hint and "spark" in ei.value.hint
    with pytest.raises(ConfigError, match=r"\[target\] spark in .*: expected a table \[target\.spark\]"):
        load_config(write(tmp_path, "[target]\nspark = 'x'\n"), env={})
    with pytest.raises(ConfigError, match=r"\[target\] engine in .*: expected a storage engine name"):
        load_config(write(tmp_path, "[target]\nengine = 'InnoDB; DROP'\n"), env={})
    with pytest.raises(ConfigError, match=r"\[target\.spark\] commit_threads .*positive"):
        load_config(write(tmp_path, "[target.spark]\ncommit_threads = 0\n"), env={})
    cfg = load_config(write(tmp_path, "[target]\nkind = 'duckdb'\n"),
                      env={"CYNOMYS_TARGET_ENGINE": "Aria", "CYNOMYS_TARGET_SPARK_COMMIT_THREADS": "2"})
    assert cfg.target.of(ColumnStoreConfig).engine == "Aria" and cfg.target.of(SparkConfig).commit_threads == 2
    assert "Aria" in repr(cfg) and "commit_threads=2" in repr(cfg)  # what `cynomys config check` prints


def test_settings_missing_from_a_config_built_in_code_read_as_defaults() -> None:
    from cynomys.core.config import TargetConfig

    t = TargetConfig(kind="spark")
    assert t.of(SparkConfig) == SparkConfig() and t.of(ColumnStoreConfig).engine == "ColumnStore"
    t = t.with_options(SparkConfig(master="local[1]")).with_options(SparkConfig(master="local[2]"))
    assert t.of(SparkConfig).master == "local[2]" and len(t.options) == 1


def test_every_registered_settings_class_lives_in_its_target_folder_and_imports_only_core() -> None:
    """The loader imports these modules by path (core/targets.py): they must
    stay light (no driver) and below nothing but core, so the layering holds."""
    import ast
    import dataclasses
    import importlib

    from cynomys.core.config import TargetOptions
    from cynomys.core.targets import TARGET_CONFIGS, TARGETS

    root = Path(__file__).parents[2]
    for kind, spec in TARGET_CONFIGS.items():
        assert kind in TARGETS
        module, _, name = spec.partition(":")
        assert module == f"cynomys.applier.targets.{kind}.config", spec
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, TargetOptions) and dataclasses.is_dataclass(cls)
        assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        tree = ast.parse((root / (module.replace(".", "/") + ".py")).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert all(m.startswith("cynomys.core") for m in imported if m.startswith("cynomys")), imported
        assert not {"pyspark", "pymysql", "pymonetdb", "duckdb"} & {m.split(".")[0] for m in imported}


def test_config_check_builds_the_target_so_its_own_checks_run(tmp_path: Path) -> None:
    from cynomys.cli.config import check_target

    bad = load_config(write(tmp_path, "[target]\nkind = 'monetdb'\nurl = 'mysql://u:p@h:1/'\n"), env={})
    with pytest.raises(ConfigError, match="is not monetdb://"):
        check_target(bad)
    good = load_config(write(tmp_path, "[target]\nkind = 'duckdb'\nurl = 'r.duckdb'\n"), env={})
    assert check_target(good) == ""
