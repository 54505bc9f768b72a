"""The Prometheus alerting rules shipped in deploy/: promtool checks and
runs their unit tests (deploy/alerts.test.yml), every rule has a test
that makes it fire, and every metric a rule reads is one the daemons
export (so a renamed metric cannot leave a rule silently empty)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cynomys.core.config import load_config
from cynomys.metrics import ApplierMonitor, ProducerMonitor

DEPLOY = Path(__file__).parents[2] / "deploy"
RULES = DEPLOY / "alerts.yml"
RULE_TESTS = DEPLOY / "alerts.test.yml"


def _promtool(*args: str) -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool not installed (Debian package prometheus; scripts/setup.sh installs it)")
    done = subprocess.run([tool, *args], cwd=DEPLOY, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_rules_are_valid() -> None:
    out = _promtool("check", "rules", RULES.name)
    assert "SUCCESS" in out, out


def test_rule_unit_tests_pass() -> None:
    out = _promtool("test", "rules", RULE_TESTS.name)
    assert "SUCCESS" in out, out


def test_prometheus_config_loads_the_rules() -> None:
    out = _promtool("check", "config", "prometheus.yml")
    assert "1 rule files found" in out, out


def test_every_alert_has_a_test_that_fires_it() -> None:
    alerts = set(re.findall(r"^\s*- alert: (\w+)", RULES.read_text(), re.M))
    fired: set[str] = set()
    # An alert_rule_test entry: its alertname, then exp_alerts either [] or a list.
    for name, expected in re.findall(r"alertname: (\w+)\n\s*exp_alerts:(.*)", RULE_TESTS.read_text()):
        if expected.strip() != "[]":
            fired.add(name)
    assert len(alerts) >= 10, alerts
    assert alerts <= fired, f"alerts no test makes fire: {sorted(alerts - fired)}"


def test_rules_read_only_metrics_the_daemons_export(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text(f'[producer]\nstate_dir = "{tmp_path}"\n[applier]\nstate_dir = "{tmp_path}"\n')
    cfg = load_config(cfg_file, env={})
    exported: set[str] = set()
    for mon in (ProducerMonitor(cfg), ApplierMonitor(cfg)):
        for fam in text_string_to_metric_families(generate_latest(mon.registry).decode()):
            exported.add(fam.name)
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(fam.type, ())
            exported.update(fam.name + s for s in suffixes)
    used = set(re.findall(r"\bcynomys_\w+", RULES.read_text()))
    assert used, "no metric found in the rules"
    assert used <= exported, f"rules read metrics no daemon exports: {sorted(used - exported)}"
