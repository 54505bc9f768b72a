"""Configuration: defaults, validation naming key and file, env overrides, redaction."""
from __future__ import annotations

from pathlib import Path

import pytest

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
    assert cfg.target.spark.conf == {"spark.executor.memory": "1g"}
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
    assert cfg.target.spark.master == "local[2]" and cfg.source.port == 3310
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
