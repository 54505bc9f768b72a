"""A hostile target server must not read the applier's files (issue #13, item 1).

A MySQL server may answer *any* statement with a LOCAL INFILE request
naming a file, and pymysql sends that file.  The fake server here speaks
just enough of the protocol on loopback to accept a login, answer OK, and
then ask for a secret file in answer to an ordinary statement.
"""
from __future__ import annotations

import socket
import struct
import threading
from pathlib import Path
from typing import Iterator

import pytest

from cynomys.applier.targets.columnstore.config import ColumnStoreConfig
from cynomys.applier.targets.columnstore.target import ColumnStoreTarget
from cynomys.core.config import Config, TargetConfig
from cynomys.core.errors import ConfigError, TargetRejectedError

pytestmark = pytest.mark.integration

# CLIENT_LONG_PASSWORD | CLIENT_LOCAL_FILES | CLIENT_PROTOCOL_41 | CLIENT_TRANSACTIONS
# | CLIENT_SECURE_CONNECTION | CLIENT_PLUGIN_AUTH
_CAPS = 0x1 | 0x80 | 0x200 | 0x2000 | 0x8000 | 0x80000
_OK = b"\x00\x00\x00\x02\x00\x00\x00"  # OK, 0 rows, id 0, status AUTOCOMMIT, 0 warnings


class FakeMySQL:
    """Accepts one login, answers OK to every statement except the one
    starting with ``trigger``, which gets a LOCAL INFILE request for ``wanted``.
    ``received`` collects every byte the client sent after the request."""

    def __init__(self, wanted: str, trigger: bytes) -> None:
        self.wanted, self.trigger = wanted, trigger
        self.received = b""
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @staticmethod
    def _send(conn: socket.socket, seq: int, payload: bytes) -> None:
        conn.sendall(struct.pack("<I", len(payload))[:3] + bytes([seq]) + payload)

    @staticmethod
    def _recv(conn: socket.socket) -> tuple[int, bytes]:
        head = b""
        while len(head) < 4:
            chunk = conn.recv(4 - len(head))
            if not chunk:
                raise EOFError
            head += chunk
        n, seq = int.from_bytes(head[:3], "little"), head[3]
        body = b""
        while len(body) < n:
            chunk = conn.recv(n - len(body))
            if not chunk:
                raise EOFError
            body += chunk
        return seq, body

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        try:
            salt = b"abcdefgh" + b"ijklmnopqrst"
            greeting = (b"\x0a5.7.99-fake\x00" + struct.pack("<I", 7) + salt[:8] + b"\x00"
                        + struct.pack("<H", _CAPS & 0xFFFF) + b"\x21" + struct.pack("<H", 2)
                        + struct.pack("<H", _CAPS >> 16) + bytes([21]) + b"\x00" * 10 + salt[8:] + b"\x00"
                        + b"mysql_native_password\x00")
            self._send(conn, 0, greeting)
            self._recv(conn)                      # the login
            self._send(conn, 2, _OK)
            while True:
                _, query = self._recv(conn)
                if query[:1] == b"\x01":          # COM_QUIT
                    return
                if query[1:].startswith(self.trigger):
                    self._send(conn, 1, b"\xfb" + self.wanted.encode())
                    seq = 2
                    while True:                   # file packets until the empty one
                        seq, data = self._recv(conn)
                        self.received += data
                        if not data:
                            break
                    self._send(conn, seq + 1, _OK)
                else:
                    self._send(conn, 1, _OK)
        except (EOFError, OSError):
            return
        finally:
            conn.close()
            self.sock.close()


@pytest.fixture
def secret(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "applier_private.pem"
    path.write_text("-----BEGIN PRIVATE KEY-----\nTOP-SECRET\n-----END PRIVATE KEY-----\n")
    yield path


@pytest.mark.parametrize("query", ["", "?local_infile=0", "?local_infile=1"])
def test_server_cannot_read_a_file_with_an_ordinary_statement(secret: Path, query: str) -> None:
    fake = FakeMySQL(str(secret), trigger=b"CREATE DATABASE")
    target = ColumnStoreTarget(Config(target=TargetConfig(
        kind="columnstore", url=f"mysql://u:p@127.0.0.1:{fake.port}/{query}", options=(ColumnStoreConfig("InnoDB"),))))
    with pytest.raises(TargetRejectedError) as info:
        target.connect()                          # its first statement: CREATE DATABASE IF NOT EXISTS
    target.close()
    fake.thread.join(timeout=10)
    assert b"TOP-SECRET" not in fake.received
    assert str(secret) in str(info.value) and "did not offer" in str(info.value)


def test_tls_options_are_explicit_and_verify_by_default(tmp_path: Path) -> None:
    import ssl

    def dsn(url: str) -> dict[str, object]:
        parsed, _ = ColumnStoreTarget._parse_url(url)
        return parsed

    assert dsn("mysql://u:p@h:3306/")["ssl_disabled"] is True and dsn("mysql://u:p@h:3306/")["local_infile"] is True
    assert dsn("mysql://u:p@h:3306/?local_infile=0")["local_infile"] is False
    ctx = dsn("mysql://u:p@h:3306/?ssl=1")["ssl"]
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    loose = dsn("mysql://u:p@h:3306/?ssl=1&ssl_verify=0")["ssl"]
    assert isinstance(loose, ssl.SSLContext) and loose.verify_mode == ssl.CERT_NONE
    with pytest.raises(ConfigError):
        dsn(f"mysql://u:p@h:3306/?ssl_ca={tmp_path / 'missing.pem'}")
    with pytest.raises(ConfigError):
        dsn("mysql://u:p@h:3306/?ssl_verify=maybe&ssl=1")


def test_tls_required_is_not_downgraded() -> None:
    """A server that offers no TLS (the fake one) is refused when the url asks for TLS."""
    fake = FakeMySQL("/nonexistent", trigger=b"NEVER")
    target = ColumnStoreTarget(Config(target=TargetConfig(
        kind="columnstore", url=f"mysql://u:p@127.0.0.1:{fake.port}/?ssl=1", options=(ColumnStoreConfig("InnoDB"),))))
    with pytest.raises((TargetRejectedError,)) as info:
        target.connect()
    target.close()
    assert "SSL" in str(info.value) or "TLS" in str(info.value)
