"""TLS to the source ([source] ssl_ca, ssl_cert, ssl_key) against a real
MariaDB with TLS: the replication user may only connect over TLS (REQUIRE
SSL / REQUIRE X509), so every connection the producer makes — settings
checks, the binlog stream, snapshot reads — must be encrypted and the
server verified."""
from __future__ import annotations

import ssl
from pathlib import Path
from typing import Iterator

import pytest

from cynomys.core.config import load_config
from cynomys.core.errors import ConfigError, CynomysError
from cynomys.core.model import Position
from cynomys.core.tls import source_ssl_context
from cynomys.parser.stream import BinlogSource, SourceInspector
from cynomys.producer import Producer
from cynomys.snapshot.source import SnapshotConnection
from tests.helpers import ListSink, write_config
from tests.servers.mariadb import REPL_PASSWORD, REPL_USER, MariaDBServer
from tests.servers.tls import TlsFiles, make_client_cert, make_tls_files

pytestmark = pytest.mark.integration

CERT_USER = "cynomys_x509"


@pytest.fixture(scope="module")
def tls_source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MariaDBServer, TlsFiles]]:
    tls = make_tls_files(tmp_path_factory.mktemp("source-tls"))
    server = MariaDBServer(server_id=1, extra_args=(f"--ssl-ca={tls.ca_cert}", f"--ssl-cert={tls.server_cert}",
                                                    f"--ssl-key={tls.server_key}")).start()
    try:
        server.execute(f"ALTER USER '{REPL_USER}'@'127.0.0.1' REQUIRE SSL",
                       f"CREATE USER '{CERT_USER}'@'127.0.0.1' IDENTIFIED BY '{REPL_PASSWORD}' REQUIRE X509",
                       f"GRANT ALL ON *.* TO '{CERT_USER}'@'127.0.0.1'")
        assert server.execute("SHOW VARIABLES LIKE 'have_ssl'")[0][1] == "YES"
        yield server, tls
    finally:
        server.destroy()


def _tls_version(conn: object) -> str:
    with conn.cursor() as cur:  # type: ignore[attr-defined]
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_version'")
        return str(cur.fetchone()[1])


def test_every_source_connection_uses_verified_tls(tls_source: tuple[MariaDBServer, TlsFiles],
                                                   tmp_path: Path) -> None:
    server, tls = tls_source
    server.execute("CREATE DATABASE IF NOT EXISTS tlsdb", "CREATE TABLE tlsdb.t (id INT PRIMARY KEY, v TEXT)")
    start = "{}:{}".format(*server.execute("SHOW MASTER STATUS")[0][:2])
    server.execute("INSERT INTO tlsdb.t VALUES (1, 'over TLS')")
    # Relative to the config file, as users write it (both live under pytest's base temp dir).
    assert tls.ca_cert.parent.parent == tmp_path.parent
    relative = Path("..") / tls.ca_cert.parent.name / tls.ca_cert.name
    cfg = load_config(write_config(tmp_path / "c.toml", server, source={
        "include_tables": ["tlsdb.*"], "start": start, "ssl_ca": str(relative)}), env={})
    assert Path(cfg.source.ssl_ca).is_absolute() and Path(cfg.source.ssl_ca).resolve() == tls.ca_cert.resolve()

    ins = SourceInspector(cfg.source)
    try:
        assert _tls_version(ins.conn).startswith("TLS")
    finally:
        ins.close()
    snap = SnapshotConnection(cfg.source)
    try:
        assert _tls_version(snap.conn).startswith("TLS")
    finally:
        snap.close()
    # The binlog stream: the user is REQUIRE SSL, so reading it at all proves TLS.
    sink = ListSink()
    Producer(cfg, sink, blocking=False).run()
    rows = [c for c in sink.changes() if c.table == "t"]
    assert [r.after for r in rows] == [(1, "over TLS")]


def test_tls_is_required_once_configured(tls_source: tuple[MariaDBServer, TlsFiles], mariadb: MariaDBServer,
                                        tmp_path: Path) -> None:
    server, tls = tls_source
    ctx = source_ssl_context(load_config(write_config(tmp_path / "a.toml", server,
                                                      source={"ssl_ca": str(tls.ca_cert)}), env={}).source)
    assert ctx is not None and ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname
    # A server without TLS: no silent fall-back to clear text (pymysql's own
    # default is "TLS if offered, unverified"), a ConfigError instead.
    plain = load_config(write_config(tmp_path / "b.toml", mariadb, source={"ssl_ca": str(tls.ca_cert)}), env={})
    with pytest.raises(ConfigError, match="does not offer TLS"):
        SourceInspector(plain.source)


def test_a_server_certificate_from_another_ca_is_a_config_error(tls_source: tuple[MariaDBServer, TlsFiles],
                                                                tmp_path: Path) -> None:
    server, _ = tls_source
    stranger = make_tls_files(tmp_path / "other-ca")
    cfg = load_config(write_config(tmp_path / "c.toml", server, source={"ssl_ca": str(stranger.ca_cert)}), env={})
    start = Position.parse("{}:{}".format(*server.execute("SHOW MASTER STATUS")[0][:2]))
    connects = (lambda: SourceInspector(cfg.source), lambda: SnapshotConnection(cfg.source),
                lambda: next(iter(BinlogSource(cfg.source, start, blocking=False))))
    # The binlog stream too: pymysql's default would otherwise be TLS
    # without verification, which this CA mismatch would not stop.
    for connect in connects:
        with pytest.raises(ConfigError, match="does not verify") as ei:
            connect()
        assert ei.value.hint is not None and "ssl_ca" in ei.value.hint


def test_client_certificate(tls_source: tuple[MariaDBServer, TlsFiles], tmp_path: Path) -> None:
    server, tls = tls_source
    cert, key = make_client_cert(tls)
    base = {"user": CERT_USER, "ssl_ca": str(tls.ca_cert)}
    cfg = load_config(write_config(tmp_path / "c.toml", server, source={**base, "ssl_cert": str(cert),
                                                                        "ssl_key": str(key)}), env={})
    ins = SourceInspector(cfg.source)
    try:
        assert _tls_version(ins.conn).startswith("TLS")
    finally:
        ins.close()
    no_cert = load_config(write_config(tmp_path / "d.toml", server, source=base), env={})
    with pytest.raises(CynomysError, match="Access denied"):
        SourceInspector(no_cert.source)
    half = load_config(write_config(tmp_path / "e.toml", server, source={**base, "ssl_cert": str(cert)}), env={})
    with pytest.raises(ConfigError, match="ssl_cert and ssl_key go together"):
        SourceInspector(half.source)


def test_no_tls_keys_mean_clear_text_not_unverified_tls(tls_source: tuple[MariaDBServer, TlsFiles],
                                                        tmp_path: Path) -> None:
    """pymysql's default against a server offering TLS is TLS with the
    certificate unverified, the mode the TLS docs say Cynomys never uses:
    without [source] ssl_* keys every connection is clear text, and a source
    that accepts only TLS stops with an error naming the key to set."""
    server, _ = tls_source
    plain_user = "cynomys_plain"
    server.execute(f"CREATE USER IF NOT EXISTS '{plain_user}'@'127.0.0.1' IDENTIFIED BY '{REPL_PASSWORD}'",
                   f"GRANT ALL ON *.* TO '{plain_user}'@'127.0.0.1'")
    cfg = load_config(write_config(tmp_path / "plain.toml", server, source={"user": plain_user}), env={})
    assert not cfg.source.ssl_ca and not cfg.source.ssl_cert
    ins = SourceInspector(cfg.source)
    try:
        assert _tls_version(ins.conn) == ""  # the server offers TLS; the client does not take it
    finally:
        ins.close()
    snap = SnapshotConnection(cfg.source)
    try:
        assert _tls_version(snap.conn) == ""
    finally:
        snap.close()
    server.execute("SET GLOBAL require_secure_transport = ON")
    try:
        for connect in (lambda: SourceInspector(cfg.source), lambda: SnapshotConnection(cfg.source)):
            with pytest.raises(ConfigError, match="without TLS") as ei:
                connect()
            assert ei.value.hint is not None and "ssl_ca" in ei.value.hint
    finally:
        server.execute("SET GLOBAL require_secure_transport = OFF")
