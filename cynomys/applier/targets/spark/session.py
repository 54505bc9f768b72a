"""The Spark session behind a Spark target: settings, the Iceberg jar,
one shared session per process, and error translation.

Settings come from ``[target.spark]``: ``master`` (``local[*]``, or
``spark://host:7077`` for a standalone cluster), the Iceberg catalog
(``catalog`` is its name in SQL, ``catalog_type`` hadoop/jdbc/hive/rest,
``warehouse``, ``catalog_uri``, ``catalog_user``/``catalog_password`` for
JDBC), then ``conf`` (any Spark setting; it wins over ours), ``jars`` and
``packages``.  A JDBC catalog's driver jar comes from the Debian package
named in ``JDBC_DRIVERS`` unless ``jars`` names one.

The Iceberg runtime jar is needed on the driver and the executors.  Without
internet access it comes from the PyPI package
``snowpark-connect-deps-iceberg==1.0.2``, found with importlib; online,
``packages = ["org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.2"]``
lets Spark download it.  A jar or package named in the config wins.

PySpark allows one active SparkContext per process, so targets in one
process share one session (reference counted; the last ``close`` stops it).
"""
from __future__ import annotations

import importlib.util
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from cynomys.applier.targets.spark import layout
from cynomys.applier.targets.spark.config import SparkConfig
from cynomys.core.config import Config
from cynomys.core.errors import ConfigError, CynomysError, TargetRejectedError, TargetUnavailableError

log = logging.getLogger(__name__)

#: The PyPI package shipping the Iceberg runtime jar (offline installs).
JAR_PACKAGE = "snowpark_connect_deps_iceberg"
JAR_PACKAGE_PIN = "snowpark-connect-deps-iceberg==1.0.2"
#: What to put in [target.spark] packages when Spark may download it.
ICEBERG_COORDINATE = "org.apache.iceberg:iceberg-spark-runtime-3.5_{scala}:1.10.2"
ICEBERG_RUNTIME = "iceberg-spark-runtime-3.5_{scala}-"


@dataclass(frozen=True)
class CatalogProfile:
    """What one kind of Iceberg catalog needs and can do."""

    needs_uri: bool          # catalog_uri is required (metastore / REST endpoint)
    rename_tables: bool      # ALTER TABLE ... RENAME TO works (Hadoop tables cannot be renamed)
    local_warehouse: bool    # warehouse is a path, resolved against the config file's folder


CATALOGS: dict[str, CatalogProfile] = {
    "hadoop": CatalogProfile(needs_uri=False, rename_tables=False, local_warehouse=True),
    # Iceberg's JdbcCatalog: one row per table (its current metadata file) in
    # a database; the data and metadata files go to ``warehouse``.
    "jdbc": CatalogProfile(needs_uri=True, rename_tables=True, local_warehouse=True),
    "hive": CatalogProfile(needs_uri=True, rename_tables=True, local_warehouse=False),
    "rest": CatalogProfile(needs_uri=True, rename_tables=True, local_warehouse=False),
}

#: Settings every session gets; [target.spark] conf overrides any of them.
BASE_CONF: dict[str, str] = {
    "spark.app.name": "cynomys-applier",
    "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
    # TIMESTAMP values travel as UTC instants; a UTC session keeps casts and
    # displays free of the host's zone.
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
    # Writes may cast (int -> bigint after a promotion) but never silently
    # truncate; overflow raises.
    "spark.sql.storeAssignmentPolicy": "ANSI",
}

#: Settings for local masters: a flush is small, and Spark's 200 shuffle
#: partitions cost more in task scheduling than the work (bench --quick on
#: 2 cores: a 50k-row flush 7.8 s -> 3.3 s, a one-row flush 2.7 s -> 0.6 s).
#: A cluster keeps Spark's default, with adaptive execution coalescing it.
LOCAL_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": str(max(2, os.cpu_count() or 2)),
}


#: Settings of the applier's session only (not ``cynomys sql``'s); the
#: user's ``[target.spark] conf`` still wins.  Iceberg 1.10's vectorized
#: Parquet reader leaks one direct-memory vector per batch of a format-v3
#: table's row-lineage columns (``_row_id``, ``_last_updated_sequence_number``),
#: which the target scan of every MERGE reads (apache/iceberg#17241, fixed in
#: 1.11 by #17296; the jar shipped on PyPI is 1.10.2).  Measured here: +2.4-3.2
#: MB of JVM direct memory per MERGE reading 200k target rows, flat without
#: vectorization at the same speed (0.81 vs 0.77 s a MERGE); a 10M-row initial
#: load killed the applier's JVM ("Cannot reserve 4194304 bytes of direct
#: buffer memory", 3 GB allocated) after 6M rows.
WRITER_CONF: dict[str, str] = {
    "spark.sql.iceberg.vectorization.enabled": "false",
}


@dataclass(frozen=True)
class JdbcDriver:
    """A JDBC driver for the Iceberg JDBC catalog, by the scheme of its URL."""

    jar: str         # where its Debian package puts it
    package: str     # the Debian package
    marker: str      # text in a jar name that means "this driver is already given"


JDBC_DRIVERS: dict[str, JdbcDriver] = {
    "postgresql": JdbcDriver("/usr/share/java/postgresql.jar", "libpostgresql-jdbc-java", "postgresql"),
    "mariadb": JdbcDriver("/usr/share/java/mariadb-java-client.jar", "libmariadb-java", "mariadb-java-client"),
    # MariaDB Connector/J also speaks to MySQL, with a jdbc:mysql: URL.
    "mysql": JdbcDriver("/usr/share/java/mariadb-java-client.jar", "libmariadb-java", "mariadb-java-client"),
}

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_URI = re.compile(r"^[A-Za-z][\w+.-]*:")


def scala_version() -> str:
    """The Scala binary version PySpark was built with ('2.12')."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    for jar in jars.glob("scala-library-*.jar"):
        m = re.match(r"scala-library-(\d+\.\d+)\.", jar.name)
        if m:
            return m.group(1)
    return "2.12"


def bundled_iceberg_jar() -> Path | None:
    """The Iceberg runtime jar from the installed PyPI package, if any."""
    spec = importlib.util.find_spec(JAR_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    prefix = ICEBERG_RUNTIME.format(scala=scala_version())
    for folder in spec.submodule_search_locations:
        found = sorted((Path(folder) / "jars").glob(prefix + "*.jar"))
        if found:
            return found[-1]
    return None


def _provides_iceberg(name: str) -> bool:
    return "iceberg-spark-runtime" in name


def _warehouse(cfg: Config, sc: SparkConfig, profile: CatalogProfile) -> str | None:
    if profile.local_warehouse:
        if _URI.match(sc.warehouse) and not re.match(r"^[A-Za-z]:[\\/]", sc.warehouse):
            return sc.warehouse  # hdfs://, s3a://, file:/ ... as written
        return str(cfg.resolve(sc.warehouse).absolute())
    # Hive and REST catalogs own their warehouse; pass one only when set on purpose.
    return sc.warehouse if sc.warehouse != SparkConfig().warehouse else None


def session_conf(cfg: Config) -> dict[str, str]:
    """Every Spark setting of the session [target.spark] describes."""
    sc = cfg.target.of(SparkConfig)
    where = f"[target.spark] in {cfg.path}"
    if not _IDENT.match(sc.catalog):
        raise ConfigError(f"{where}: catalog = {sc.catalog!r} is not a plain SQL name",
                          hint="use letters, digits and _ (it is how tables are named: <catalog>.<db>.<table>)")
    problem = layout.check(sc.partition_by, sc.sort_by, sc.table_properties, sc.format_version)
    if problem:
        raise ConfigError(f"{where}: {problem}",
                          hint="see docs/guides/spark-iceberg.md#table-layout-partitions-sort-order-properties")
    profile = CATALOGS[sc.catalog_type]
    conf = dict(BASE_CONF)
    if sc.master.startswith("local"):
        conf.update(LOCAL_CONF)
    conf["spark.master"] = sc.master
    prefix = f"spark.sql.catalog.{sc.catalog}"
    conf[prefix] = "org.apache.iceberg.spark.SparkCatalog"
    conf[prefix + ".type"] = sc.catalog_type
    # Read table metadata fresh: the target checks snapshot summaries and
    # rolls back snapshots through Iceberg's API, which a cached table misses.
    conf[prefix + ".cache-enabled"] = "false"
    warehouse = _warehouse(cfg, sc, profile)
    if warehouse:
        conf[prefix + ".warehouse"] = warehouse
    if profile.needs_uri:
        if not sc.catalog_uri:
            raise ConfigError(f"{where}: catalog_type = {sc.catalog_type!r} needs catalog_uri",
                              hint="e.g. catalog_uri = 'jdbc:postgresql://db:5432/iceberg' (jdbc), "
                                   "'thrift://metastore:9083' (hive) or 'http://rest:8181' (rest)")
        conf[prefix + ".uri"] = sc.catalog_uri
    elif sc.catalog_uri:
        raise ConfigError(f"{where}: catalog_uri is set but catalog_type = {sc.catalog_type!r} does not use one",
                          hint="remove catalog_uri, or set catalog_type = 'jdbc', 'hive' or 'rest'")
    jars = [str(cfg.resolve(j).absolute()) if not _URI.match(j) else j for j in sc.jars]
    if sc.catalog_type == "jdbc":
        conf.update(_jdbc_catalog(sc, where, prefix, jars))
    elif sc.catalog_user or sc.catalog_password:
        raise ConfigError(f"{where}: catalog_user/catalog_password are for catalog_type = 'jdbc'",
                          hint="remove them, or pass the catalog's own credentials in [target.spark] conf")
    if not any(_provides_iceberg(Path(j).name) for j in jars) and not any(_provides_iceberg(p) for p in sc.packages):
        jar = bundled_iceberg_jar()
        if jar is None:
            scala = scala_version()
            raise ConfigError(
                f"{where}: the Iceberg Spark runtime jar is not available",
                hint=f"pip install '{JAR_PACKAGE_PIN}' (ships iceberg-spark-runtime-3.5_{scala}), or with internet "
                     f"access set [target.spark] packages = [\"{ICEBERG_COORDINATE.format(scala=scala)}\"], "
                     "or name a downloaded jar in [target.spark] jars")
        jars.append(str(jar))
    if jars:
        conf["spark.jars"] = ",".join(jars)
    if sc.packages:
        conf["spark.jars.packages"] = ",".join(sc.packages)
    conf.update(sc.conf)
    return conf


def _jdbc_catalog(sc: SparkConfig, where: str, prefix: str, jars: list[str]) -> dict[str, str]:
    """The JDBC catalog's settings; its driver jar appended to ``jars``."""
    m = re.match(r"^jdbc:([a-z0-9]+):", sc.catalog_uri)
    driver = JDBC_DRIVERS.get(m.group(1)) if m else None
    if driver is None:
        raise ConfigError(f"{where}: catalog_uri = {sc.catalog_uri!r} is not a JDBC URL of a supported database",
                          hint="use jdbc:postgresql://host:5432/db or jdbc:mariadb://host:3306/db")
    if not any(driver.marker in Path(j).name for j in jars):
        if not os.path.exists(driver.jar):
            raise ConfigError(f"{where}: the JDBC driver for {sc.catalog_uri.split('//')[0]} is not installed "
                              f"({driver.jar})", hint=f"apt-get install {driver.package}, or name the driver's jar "
                                                      "in [target.spark] jars")
        jars.append(driver.jar)
    # V1: the catalog's tables with Iceberg's current columns (views too);
    # V0 is kept only for catalogs made by Iceberg before 1.7.  pyiceberg's
    # SqlCatalog reads both.
    out: dict[str, str] = {prefix + ".jdbc.schema-version": "V1"}
    if sc.catalog_user:
        out[prefix + ".jdbc.user"] = sc.catalog_user
    if sc.catalog_password:
        out[prefix + ".jdbc.password"] = sc.catalog_password
    return out


# --------------------------------------------------------------------------
# One session per process, shared
# --------------------------------------------------------------------------
class _Pool:
    lock = threading.Lock()
    session: SparkSession | None = None
    master: str = ""
    users = 0
    # Bumped when a session is replaced (its JVM died): releases by users of
    # the old one must not stop the new one.
    generation = 0


def acquire(conf: dict[str, str]) -> tuple[SparkSession, int]:
    """The process's Spark session, started with ``conf`` if there is none
    (or its JVM died), and the generation to hand back to ``release``.  A
    running session gets the runtime settings of ``conf`` (catalogs are
    runtime settings, so targets with different catalogs can share it)."""
    with _Pool.lock:
        if _Pool.session is not None and not _alive(_Pool.session):
            log.warning("the Spark JVM of this process is gone; starting a new one")
            _Pool.session, _Pool.master, _Pool.users = None, "", 0
            _Pool.generation += 1
            _forget_jvm()
        if _Pool.session is not None:
            if conf.get("spark.master") != _Pool.master:
                raise ConfigError(
                    f"a Spark session with master {_Pool.master!r} already runs in this process; "
                    f"cannot start another with {conf.get('spark.master')!r}",
                    hint="use one [target.spark] master per process")
            _apply_runtime(_Pool.session, conf)
            _warn_missing_jars(_Pool.session, conf)
            _Pool.users += 1
            return _Pool.session, _Pool.generation
        builder = SparkSession.builder
        for key, value in conf.items():
            builder = builder.config(key, value)
        log.info("starting Spark (master %s)", conf.get("spark.master"))
        session = builder.getOrCreate()
        _apply_runtime(session, conf)  # a session started earlier by the host process
        _Pool.session, _Pool.master, _Pool.users = session, conf.get("spark.master", ""), 1
        return session, _Pool.generation


def _warn_missing_jars(session: SparkSession, conf: dict[str, str]) -> None:
    """Jars are fixed when the JVM starts: a target sharing a running
    session gets only the ones it was started with (a JDBC catalog's driver
    among them)."""
    have = set(session.sparkContext.getConf().get("spark.jars", "").split(","))
    missing = [j for j in conf.get("spark.jars", "").split(",") if j and j not in have]
    if missing:
        log.warning("the Spark session of this process was started without %s; a target sharing it cannot use "
                    "them (a JDBC catalog would not find its driver): start one Spark target per process, or "
                    "give the first one every jar", ", ".join(missing))


def _alive(session: SparkSession) -> bool:
    try:
        session._jsparkSession.version()
        return not session.sparkContext._jsc.sc().isStopped()
    except Exception:  # Py4J cannot reach the JVM
        return False


def _apply_runtime(session: SparkSession, conf: dict[str, str]) -> None:
    for key, value in conf.items():
        if not key.startswith("spark.sql.") or session.conf.get(key, None) == value:
            continue
        try:
            session.conf.set(key, value)
        except Exception as exc:  # a static setting: it keeps the value the session started with
            log.warning("Spark setting %s cannot change in a running session (%s); it stays %r",
                        key, str(exc).splitlines()[0], session.conf.get(key, None))


def release(generation: int) -> None:
    """One user fewer; the last one stops the session."""
    with _Pool.lock:
        if _Pool.session is None or generation != _Pool.generation:
            return
        _Pool.users -= 1
        if _Pool.users > 0:
            return
        session, _Pool.session, _Pool.master = _Pool.session, None, ""
        _Pool.generation += 1
    try:
        session.stop()
    except Exception as exc:  # the JVM is already gone: forget it so the next start launches a new one
        log.warning("stopping Spark failed (%s); a new JVM starts next time", exc)
        _forget_jvm()


def _forget_jvm() -> None:
    """Drop PySpark's handles on a dead JVM so the next session launches a new one."""
    from pyspark import SparkContext

    SparkContext._active_spark_context = None
    SparkContext._gateway = None
    SparkContext._jvm = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None


# --------------------------------------------------------------------------
# Errors: Py4J / Spark / Iceberg -> TargetUnavailableError or TargetRejectedError
# --------------------------------------------------------------------------
#: Text in an exception (class names of its Java cause chain included) that
#: means "retry later": the JVM, the cluster, the catalog or a concurrent
#: committer is in the way, not the data.
TRANSIENT_MARKERS: tuple[str, ...] = (
    "Py4JNetworkError", "Answer from Java side is empty", "Error while receiving", "Error while sending",
    "SparkContext was shut down", "stopped SparkContext", "SparkContext has been shutdown",
    "java.net.ConnectException", "java.net.SocketTimeoutException", "java.net.UnknownHostException",
    "java.net.NoRouteToHostException", "Connection refused", "RpcTimeoutException",
    "org.apache.iceberg.exceptions.CommitFailedException",
    # The commit may or may not have happened: the snapshot markers tell on retry.
    "org.apache.iceberg.exceptions.CommitStateUnknownException",
    "org.apache.iceberg.exceptions.ServiceUnavailableException",
    # Serializable isolation: another writer committed files that the flush's
    # MERGE/DELETE would have had to see (an operator's fix, another job's
    # compaction).  Iceberg refuses the commit without writing anything; the
    # flush (already rolled back per table by the markers) is redone on top.
    "ValidationException: Found conflicting", "ValidationException: Found new conflicting",
    # The same race from the other side: another writer's commit removed a
    # data file (a compaction rewrote it) that this commit's deletes point at.
    "ValidationException: Cannot commit, missing data files",
    # Format v3: a commit whose validation window holds two DVs of one data
    # file (another writer replaced its DV meanwhile) is refused with this,
    # though the table is fine and nothing was written (apache/iceberg#17764,
    # fixed after the 1.10 line we pin): a conflict like the two above.
    "ValidationException: Can't index multiple DVs",
)


def is_spark_error(exc: BaseException) -> bool:
    """An exception raised by PySpark, Py4J or the JVM behind them."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    return isinstance(exc, (Py4JError, PySparkException, ConnectionError, EOFError))


def _text(exc: BaseException) -> str:
    parts = [type(exc).__name__, str(exc)]
    trace = getattr(exc, "_stackTrace", None)  # CapturedException: the JVM stack trace text
    if isinstance(trace, str):
        parts.append(trace)
    return "\n".join(parts)


def first_line(exc: BaseException) -> str:
    """What went wrong, in one line: for a Java exception its root cause
    (a Py4JJavaError's own text is 'An error occurred while calling o42.sql')."""
    text = str(exc)
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            for _ in range(20):
                cause = java.getCause()
                if cause is None:
                    break
                java = cause
            text = str(java.toString())
        except Exception as inner:  # the JVM is gone: keep the Python side's text
            log.debug("cannot read the Java cause of %s: %s", type(exc).__name__, inner)
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:500]
    return type(exc).__name__


def translate(exc: BaseException, what: str, hint: str | None = None) -> CynomysError:
    """A PySpark / Py4J exception -> the error the applier's retry policy reads."""
    text = _text(exc)
    if isinstance(exc, (ConnectionError, EOFError)) or any(m in text for m in TRANSIENT_MARKERS):
        return TargetUnavailableError(f"{what}: Spark is unavailable ({first_line(exc)})",
                                      hint="check that Spark (the master and its workers) and the Iceberg catalog "
                                           "are up; Cynomys retries")
    return TargetRejectedError(f"{what}: Spark/Iceberg refused it: {first_line(exc)}", hint=hint)
