"""SparkTarget against a Spark standalone cluster: one master and one worker
started from the installed PySpark on 127.0.0.1, the warehouse on local disk
shared by the driver (this process) and the executor (the worker's JVM)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pyspark
import pytest

from cynomys.applier.targets.spark.config import SparkConfig
from cynomys.applier.targets.spark.target import SparkTarget
from cynomys.core.config import Config, TargetConfig
from cynomys.core.model import ColumnDef, Op, TableSchema
from tests.integration import target_contract as contract

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


class StandaloneCluster:
    """A master and one worker (1 core, 1 GiB), each a spark-class process."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port, self.ui, self.worker_ui = free_port(), free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_LOG_DIR": str(workdir / "logs"), "SPARK_WORKER_DIR": str(workdir / "work")}

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.workdir / f"{name}.log", "wb")
        self.procs.append(subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], env=self.env,
                                           stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir))

    def start(self) -> StandaloneCluster:
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui))
        self._spawn("worker", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                    "--cores", "1", "--memory", "1g", "--webui-port", str(self.worker_ui),
                    "--work-dir", str(self.workdir / "work"))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited ({p.returncode}); see {self.workdir}/*.log")
            try:
                if _json(f"http://127.0.0.1:{self.ui}/json/").get("aliveworkers") == 1:
                    return self
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the standalone cluster did not come up; see {self.workdir}/*.log")

    def stop(self) -> None:
        for p in reversed(self.procs):  # worker first (it stops its executors), then the master
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    c = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster")).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def target(cluster: StandaloneCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkTarget]:
    conf = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        # The executor connects back to the driver on loopback.
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": "1",
    }
    warehouse = tmp_path_factory.mktemp("cluster-warehouse")
    cfg = Config(target=TargetConfig(kind="spark", options=(SparkConfig(master=cluster.url, warehouse=str(warehouse),
                                                                        catalog="cluster", conf=conf),)))
    t = SparkTarget(cfg)
    t.connect()
    yield t
    t.close()


def test_flushes_through_a_standalone_cluster(cluster: StandaloneCluster, target: SparkTarget) -> None:
    sc = target.spark.sparkContext
    assert sc.master == cluster.url
    db = "cluster_db"
    keyed = TableSchema(db, "k", (ColumnDef("id", "bigint unsigned"), ColumnDef("v", "varchar(10)"),
                                  ColumnDef("t", "time(6)")), ("id",))
    bag = TableSchema(db, "bag", (ColumnDef("a", "int"), ColumnDef("s", "varchar(5)")), ())
    import datetime
    hour = datetime.timedelta(hours=30)
    rows = [(2**64 - 1, "max", hour), (1, "one", -hour), (2, "two", None)]
    target.apply(contract.flush([contract.change(Op.INSERT, keyed, after=r) for r in rows]
                                + [contract.change(Op.INSERT, bag, after=(1, "x"))] * 3))
    st = contract.state(producer="cluster")
    target.apply(contract.flush([contract.change(Op.UPDATE, keyed, before=rows[1], after=(1, "uno", hour)),
                                 contract.change(Op.DELETE, keyed, before=rows[2]),
                                 contract.change(Op.DELETE, bag, before=(1, "x")),
                                 contract.change(Op.INSERT, bag, after=(2, None))], st))
    contract.assert_rows(target, keyed, [(2**64 - 1, "max", hour), (1, "uno", hour)])
    contract.assert_rows(target, bag, [(1, "x"), (1, "x"), (2, None)])
    assert target.applied("cluster") == st
    # The work ran on the worker's executor, not in the driver.
    status = _json(f"http://127.0.0.1:{cluster.ui}/json/")
    apps = status.get("activeapps")
    assert isinstance(apps, list) and len(apps) == 1
    executors = sc._jsc.sc().getExecutorMemoryStatus().size()  # type: ignore[union-attr]
    assert executors == 2  # the driver and one executor
