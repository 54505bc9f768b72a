"""TLS for source connections ([source] ssl_ca, ssl_cert, ssl_key).

One SSLContext for every connection to the source: the settings checks,
the binlog stream (mysql-replication hands ``ssl`` to pymysql as it is) and
the snapshot reads.  TLS is on as soon as one of the three keys is set, and
then the server is always verified: its certificate against ``ssl_ca`` (or
the system's CAs when only a client certificate is configured) and its name
against ``[source] host``; with none of them set, connections are clear
text.  There is no "encrypt but don't verify" mode (pymysql's default,
turned off here): it would stop a passive listener but hand the stream, and
the replication user's password, to anyone who can answer on the source's
address.
"""
from __future__ import annotations

import logging
import ssl
from typing import Any

from cynomys.core.config import SourceConfig
from cynomys.core.errors import ConfigError

log = logging.getLogger(__name__)


_ACCESS_DENIED = 1045


def source_tls_enabled(cfg: SourceConfig) -> bool:
    return bool(cfg.ssl_ca or cfg.ssl_cert or cfg.ssl_key)


def source_ssl_context(cfg: SourceConfig) -> ssl.SSLContext | None:
    """The verifying SSLContext for the source, or None when TLS is off.

    Raises ConfigError naming the [source] key whose file cannot be used."""
    if not source_tls_enabled(cfg):
        return None
    if bool(cfg.ssl_cert) != bool(cfg.ssl_key):
        raise ConfigError("[source] ssl_cert and ssl_key go together (a client certificate and its key)",
                          hint="set both, or neither for server-only TLS")
    try:
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"[source] ssl_ca {cfg.ssl_ca} cannot be used: {_why(exc)}",
                          hint="point [source] ssl_ca at the PEM file of the CA that signed the server certificate"
                          ) from None
    if cfg.ssl_cert:
        try:
            ctx.load_cert_chain(cfg.ssl_cert, cfg.ssl_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"[source] ssl_cert {cfg.ssl_cert} / ssl_key {cfg.ssl_key} cannot be used: {_why(exc)}",
                              hint="point them at the PEM client certificate and its (unencrypted) private key"
                              ) from None
    # create_default_context already means CERT_REQUIRED + check_hostname;
    # said again so that no later edit loosens it by accident.
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.check_hostname = True
    return ctx


def source_connect_args(cfg: SourceConfig) -> dict[str, Any]:
    """Extra pymysql.connect() keyword arguments for TLS.  Off, TLS is
    disabled outright: pymysql's own default (TLS whenever the server
    offers it, its certificate unverified) is the mode this module refuses,
    and it cost every connection a load of the system's CA bundle (~2% of
    a short producer run, bench/producer_oltp.py)."""
    ctx = source_ssl_context(cfg)
    return {"ssl_disabled": True} if ctx is None else {"ssl": ctx}


def source_tls_error(exc: BaseException, cfg: SourceConfig) -> ConfigError | None:
    """A connection failure caused by TLS verification, as a ConfigError (a
    wrong CA or host name does not heal by retrying); None otherwise."""
    text = " ".join(str(a) for a in getattr(exc, "args", ()))
    if source_tls_enabled(cfg) and "SSL is required but the server doesn't support it" in text:
        return ConfigError(f"the source {cfg.host}:{cfg.port} does not offer TLS, and [source] ssl_ca/ssl_cert/"
                           "ssl_key ask for it",
                           hint="enable TLS on the server (ssl_cert, ssl_key in its config), or remove the [source] "
                                "ssl_* keys")
    code = exc.args[0] if getattr(exc, "args", ()) else 0
    if not source_tls_enabled(cfg) and (code == _ACCESS_DENIED or "insecure transport" in text):
        # MariaDB answers a clear-text login that must be TLS (REQUIRE SSL,
        # require_secure_transport) as a wrong password; MySQL names it.
        return ConfigError(f"the source {cfg.host}:{cfg.port} refused the login of [source] user {cfg.user!r} over "
                           f"a connection without TLS: {text}",
                           hint="check [source] user and password; if the server or that user requires TLS "
                                "(require_secure_transport, REQUIRE SSL/X509), set [source] ssl_ca to the PEM file of "
                                "the CA that signed the server's certificate")
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        return ConfigError(
            f"the source {cfg.host}:{cfg.port} presented a TLS certificate that does not verify: {text}",
            hint="set [source] ssl_ca to the CA that signed the server's certificate, and [source] host to a "
                 "name the certificate holds")
    return None


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc)
