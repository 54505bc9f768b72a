"""[metrics] settings, the HTTP server's refusal of a busy port, and the
health rules (on a real loopback socket; no servers needed)."""
from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cynomys.core.config import MetricsConfig, load_config
from cynomys.core.errors import ConfigError, TargetUnavailableError
from cynomys.metrics import ApplierMonitor, Health, ProducerMonitor


def _cfg(tmp_path: Path, metrics: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(f"[applier]\nstate_dir = \"{tmp_path}\"\n[producer]\nstate_dir = \"{tmp_path}\"\n"
                 f"[metrics]\n{metrics}\n")
    return p


@pytest.mark.parametrize("listen", ["9108", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", ":9108", "host:x"])
def test_bad_listen_is_refused(tmp_path: Path, listen: str) -> None:
    with pytest.raises(ConfigError, match=r"\[metrics\] listen"):
        load_config(_cfg(tmp_path, f'listen = "{listen}"'), env={})


def test_unknown_metrics_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key \[metrics\] port"):
        load_config(_cfg(tmp_path, "port = 9108"), env={})


def test_port_in_use_is_a_config_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = load_config(_cfg(tmp_path, f'listen = "127.0.0.1:{port}"'), env={})
        mon = ApplierMonitor(cfg)
        with pytest.raises(ConfigError, match="in use"):
            mon.start()


def test_two_daemons_in_one_process_serve_their_own_registries(tmp_path: Path) -> None:
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    pm = ProducerMonitor(load_config(_cfg(tmp_path, f'listen = "127.0.0.1:{ports[0]}"'), env={}))
    am = ApplierMonitor(load_config(_cfg(tmp_path, f'listen = "127.0.0.1:{ports[1]}"'), env={}))
    pm.start()
    am.start()
    try:
        am.failed(TargetUnavailableError("cannot connect to the target"))
        names = []
        for port in ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                names.append({f.name for f in text_string_to_metric_families(r.read().decode())})
        assert "cynomys_producer_events_in" in names[0] and "cynomys_applier_rows_out" not in names[0]
        assert "cynomys_applier_flush_duration_seconds" in names[1] and "cynomys_producer_leader" not in names[1]
        # The applier never turned and has an error: 503, with the reasons in the body.
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{ports[1]}/healthz", timeout=5)
        assert err.value.code == 503
        body = json.loads(err.value.read())
        assert any("TargetUnavailableError: cannot connect to the target" in r for r in body["reasons"]), body
    finally:
        pm.close()
        am.close()


def test_health_rules() -> None:
    h = Health(MetricsConfig(health_interval_s=60.0, max_lag_s=10.0), "applier", "target")
    h.beat()
    h.checked(None)
    assert h.verdict().healthy
    h.lag(11.0)
    assert h.verdict().reasons == ("lag 11.0s over max_lag_s = 10s",)
    h.lag(0.0)
    h.checked("connection refused")
    assert h.verdict().reasons == ("target unreachable: connection refused",)
    h.checked(None)
    h.failed("TargetUnavailableError: gone")
    assert not h.verdict().healthy   # an error after the last loop turn: backing off
    h.beat()
    assert h.verdict().healthy       # the loop got through again
    stalled = Health(MetricsConfig(health_interval_s=0.001, stall_intervals=1), "producer", "source")
    stalled.beat()
    stalled.checked(None)
    time.sleep(0.01)
    reasons = stalled.verdict().reasons
    assert any(r.startswith("stalled:") for r in reasons) and any("not confirmed reachable" in r for r in reasons)


def test_producer_counts_a_bulk_inserts_rows(tmp_path: Path) -> None:
    # A ManyRows (one item for a bulk insert's rows) counts its rows in and out, per table.
    from cynomys.core.columnar import ManyRows
    from cynomys.core.model import Change, ColumnDef, Op, Position, TableSchema

    schema = TableSchema("d", "t", (ColumnDef("id", "int"),), ("id",))
    bulk = ManyRows(Op.INSERT, "d", "t", "x", Position("b.1", 4), 1, schema, images=((1,), (2,), (3,)))
    one = Change(Op.DELETE, "d", "u", "x", Position("b.1", 4), 1, schema, (9,), None)
    pm = ProducerMonitor(load_config(_cfg(tmp_path, 'listen = ""'), env={}))
    pm.change_in(bulk, bulk.rows)
    pm.change_in(one)
    pm.batch_out([bulk, one])
    assert pm.events_in.labels("d.t")._value.get() == 3 and pm.events_in.labels("d.u")._value.get() == 1
    assert pm.rows_out.labels("d.t")._value.get() == 3 and pm.rows_out.labels("d.u")._value.get() == 1
