"""One small HTTP server thread per daemon: /metrics and /healthz.

/metrics is prometheus_client's own WSGI app over the daemon's registry (not
the process-wide default one, so two daemons can run in one process, as the
tests do); /healthz answers 200 or 503 with a JSON body saying why.
"""
from __future__ import annotations

import errno
import json
import logging
import socketserver
import threading
from typing import Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from cynomys.core.errors import ConfigError
from cynomys.metrics.health import Verdict

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    # A slow scraper must not hold up /healthz; threads die with the daemon.
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        # Scrapes every few seconds would drown the daemon's own log.
        log.debug("%s " + format, self.address_string(), *args)


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


class MetricsServer:
    def __init__(self, listen: str, registry: CollectorRegistry, verdict: Callable[[], Verdict]) -> None:
        self.listen = listen
        self._metrics = make_wsgi_app(registry)
        self._verdict = verdict
        host, port = parse_listen(listen)
        try:
            self._server = make_server(host, port, self._app, server_class=_ThreadingServer,
                                       handler_class=_QuietHandler)
        except OSError as exc:
            why = "the address is in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise ConfigError(f"[metrics] listen = {listen!r}: cannot listen there: {why}",
                              hint="choose a free host:port (per daemon: CYNOMYS_METRICS_LISTEN), "
                                   "or stop what holds it") from None
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="metrics-http", daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        log.info("metrics on http://%s/metrics, health on /healthz", self.listen)
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/healthz/"):
            v = self._verdict()
            body = json.dumps(v.to_dict(), default=str).encode()
            start_response("200 OK" if v.healthy else "503 Service Unavailable",
                           [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        if path in ("/metrics", "/metrics/", "/"):
            out: Iterable[bytes] = self._metrics(environ, start_response)
            return out
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics or /healthz\n"]
