"""Configuration: one TOML file -> validated, frozen dataclasses.

Unknown keys and bad values are rejected with an error naming the key and the
file (``[source] port in cynomys.toml: expected an integer``).  Any scalar key
can be overridden from the environment as ``CYNOMYS_<SECTION>_<KEY>``
(``CYNOMYS_SOURCE_PASSWORD``, ``CYNOMYS_TARGET_URL``,
``CYNOMYS_TARGET_SPARK_MASTER``) so secrets need not live in the file; secret
fields are redacted from ``repr``.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, TypeVar

from cynomys.core.errors import ConfigError
from cynomys.core.targets import TARGET_KINDS, target_config_classes

# Field metadata keys: "check" -> (predicate, what-is-expected), "secret" ->
# bool, "path" -> bool, "required" -> bool (with a "check" saying what to
# give).  Public: the targets' own settings classes
# (cynomys/applier/targets/<kind>/config.py) declare their keys with them.
Check = tuple[Callable[[Any], bool], str]


def checked(pred: Callable[[Any], bool], expected: str) -> dict[str, Any]:
    """Field metadata: the value must satisfy ``pred`` (``expected`` says how, in errors)."""
    return {"check": (pred, expected)}


def one_of(*choices: str) -> dict[str, Any]:
    return checked(lambda v: v in choices, "one of " + ", ".join(repr(c) for c in choices))


POSITIVE = checked(lambda v: v > 0, "a positive number")
NON_NEGATIVE = checked(lambda v: v >= 0, "a number >= 0")
SECRET: dict[str, Any] = {"secret": True}
# A file path taken relative to the config file's folder when loaded (for
# values handed to code that never sees the Config, e.g. TLS files of the
# source connection, which the parser and the snapshot open).
PATH: dict[str, Any] = {"path": True}


@dataclass(frozen=True)
class SourceConfig:
    """The MySQL/MariaDB server whose binlog is read."""

    host: str = "127.0.0.1"
    port: int = field(default=3306, metadata=checked(lambda v: 0 < v < 65536, "a TCP port (1-65535)"))
    user: str = "cynomys"
    password: str = field(default="", repr=False, metadata=SECRET)
    # Our replica id on the source; must differ from every server's server_id.
    server_id: int = field(default=4271, metadata=POSITIVE)
    include_tables: list[str] = field(default_factory=lambda: ["*.*"])
    exclude_tables: list[str] = field(default_factory=list)
    # Where a producer with no checkpoint starts: "current" (the source's
    # current binlog end), "earliest" (oldest binlog still on the source),
    # "file:pos" (e.g. "mysql-bin.000003:4") or a GTID position.
    start: str = "current"
    use_gtid: bool = False
    # A replicated table with a foreign key ON DELETE/ON UPDATE CASCADE or
    # SET NULL: the source writes the rows such an action changes to no
    # binlog.  "refuse" stops the producer naming the key (at start, and at
    # a DDL that adds one); "allow" replicates the table, and those rows stay
    # on the target as they were until `cynomys verify --repair`.
    cascading_foreign_keys: str = field(default="refuse", metadata=one_of("refuse", "allow"))
    connect_timeout_s: float = field(default=10.0, metadata=POSITIVE)
    heartbeat_s: float = field(default=5.0, metadata=POSITIVE)
    # TLS to the source: on when any of the three is set, for every source
    # connection (settings, binlog stream, snapshots).  The server
    # certificate is always verified (against ssl_ca, or the system CAs when
    # only a client certificate is given) and must name [source] host.
    ssl_ca: str = field(default="", metadata=PATH)
    ssl_cert: str = field(default="", metadata=PATH)
    ssl_key: str = field(default="", metadata=PATH)
    # Archived binlog files to read instead of the server (a glob, taken
    # relative to the config file's folder, e.g. "archive/mysql-bin.[0-9]*"):
    # `cynomys produce` replays them in binlog order and stops at their end.
    # "" = the live server.
    binlog_files: str = field(default="", metadata={**PATH, **checked(
        lambda v: not v or not v.endswith("/"), "a glob of binlog files, not a folder (e.g. 'dir/mysql-bin.[0-9]*')")})


@dataclass(frozen=True)
class ProducerConfig:
    id: str = "producer-1"
    state_dir: str = "./state/producer"
    batch_max_events: int = field(default=5000, metadata=POSITIVE)
    batch_max_delay_ms: int = field(default=200, metadata=NON_NEGATIVE)
    # Render the SQL text into row-change records too (costs producer CPU;
    # the typed images carry the same statement).  DDL always keeps its SQL.
    emit_sql: bool = False
    # Upper bound of un-acknowledged bytes buffered before the producer stops
    # reading the binlog (back-pressure when the transport is slow or down).
    max_pending_bytes: int = field(default=64 * 1024 * 1024, metadata=POSITIVE)
    # High availability (cynomys/producer/ha.py): several producers with this config
    # may run; one holds a lease in Redis and works, the others stand by.
    # The checkpoint then lives in Redis next to the stream (shared by all).
    ha: bool = False
    # Lease length: a dead or stalled leader is replaced within about
    # lease_ms * 1.25 plus a producer start (renewed every lease_ms / 3).
    lease_ms: int = field(default=5000, metadata=checked(lambda v: v >= 300, "at least 300 (milliseconds)"))


@dataclass(frozen=True)
class TransportConfig:
    kind: str = field(default="redis", metadata=one_of("redis", "file"))
    url: str = field(default="redis://127.0.0.1:6379/0", repr=False, metadata=SECRET)
    stream: str = "cynomys"
    mode: str = field(default="stream", metadata=one_of("stream", "pubsub"))
    path: str = ""
    # Rotate the AES data key after this many envelopes or seconds.
    key_rotate_envelopes: int = field(default=1000, metadata=POSITIVE)
    key_rotate_seconds: float = field(default=300.0, metadata=POSITIVE)
    # Approximate cap on stream length; entries not yet acknowledged are never trimmed.
    max_stream_len: int = field(default=100_000, metadata=POSITIVE)
    consumer_group: str = "cynomys-appliers"
    dead_letter_stream: str = ""  # default: "<stream>:dead"
    # Largest payload an envelope may open to (bytes after gunzip).  The
    # signature already keeps strangers away from the decompressor; this
    # bounds what a signed envelope can cost the applier in memory.
    max_envelope_bytes: int = field(default=64 * 1024 * 1024, metadata=POSITIVE)


@dataclass(frozen=True)
class SecurityConfig:
    """Key files (paths).  The producer needs applier_public_key and
    producer_private_key; the applier needs applier_private_key and
    producer_public_key.  A passphrase for private keys comes from
    CYNOMYS_SECURITY_PASSPHRASE."""

    applier_public_key: str = ""
    producer_private_key: str = ""
    applier_private_key: str = ""
    producer_public_key: str = ""
    passphrase: str = field(default="", repr=False, metadata=SECRET)
    # A private key file group or others can access is refused; true only
    # warns (for key stores whose permissions cannot be changed).
    allow_readable_private_keys: bool = False


@dataclass(frozen=True)
class ApplierConfig:
    buffer_rows: int = field(default=10_000, metadata=POSITIVE)
    max_delay_ms: int = field(default=1000, metadata=NON_NEGATIVE)
    # Adaptive delay commit: buffer_rows / max_delay_ms are the floor a quiet
    # source sees; while envelopes keep arriving (the applier is behind) a
    # flush waits for them, up to this many buffered net changes, folded (memory bound;
    # 0 = the target's backlog_factor x buffer_rows (3 on Spark, 5 on ColumnStore/MariaDB, 1 elsewhere),
    # on Spark at least 400,000, which max_memory_mb bounds first for wide rows;
    # each buffered lineitem change costs the applier 2-7 KB).  A target whose commit is dear (Spark/Iceberg)
    # then pays it once for the whole backlog instead of once per buffer_rows.
    max_buffer_rows: int = field(default=0, metadata=NON_NEGATIVE)
    # The applier's memory bound, in MB, whatever a source transaction's
    # size: a transaction whose buffered part would pass its share of this
    # is applied in parts into one target transaction kept open until its
    # last fragment (Spark/Iceberg: staged in a branch of each table and
    # published at its end), never visible in part (applier/spill.py).
    max_memory_mb: int = field(default=500, metadata=POSITIVE)
    # A flush commits on a worker thread as the applier takes and folds the
    # next one (applier/committer.py): the target loads while the applier
    # works instead of waiting for it, and the next flush starts when this
    # one is done (group commit).  Its envelopes are acknowledged once it
    # committed; at most one is in flight, and its buffer counts against
    # max_memory_mb until then.  false: each flush commits before the next
    # envelope is taken.
    overlap_commits: bool = True
    state_dir: str = "./state/applier"
    consumer_name: str = "applier-1"
    # DDL statements to skip on purpose, by exact text or a "position"
    # (file:pos) of the event, when the target cannot run them.
    skip_ddl: list[str] = field(default_factory=list)
    # Partitioned appliers (cynomys/applier/partition.py): tables are spread
    # over `partitions` appliers by crc32("db.table") mod partitions; this
    # process is number `partition` (0-based; CYNOMYS_APPLIER_PARTITION lets
    # N processes share one file).  Each keeps its own state on the target
    # and its own consumer group.
    partitions: int = field(default=1, metadata=POSITIVE)
    partition: int = field(default=0, metadata=NON_NEGATIVE)
    # A partition takes every envelope, also those holding none of its
    # tables; their progress is committed with its next flush of data, or
    # after this long without one (not one target write per such envelope).
    progress_interval_ms: int = field(default=5000, metadata=POSITIVE)

    def cross_check(self) -> str | None:
        """A problem between keys (named in the message), or None."""
        if self.partition >= self.partitions:
            return (f"partition = {self.partition} is outside partitions = {self.partitions}: expected "
                    f"0 .. {self.partitions - 1}")
        return None


class TargetOptions:
    """Base of a target's own settings: a frozen dataclass in the target's
    folder (``cynomys/applier/targets/<kind>/config.py``), registered in
    ``cynomys.core.targets.TARGET_CONFIGS``.  Its keys are read from the
    TOML table ``[target.<section>]``, or from ``[target]`` itself when
    ``section`` is '' (``engine`` of ColumnStore, kept where it has always
    been); validated, overridden from the environment and documented like
    every other key.  A target reads its settings with
    ``cfg.target.of(ItsConfig)``."""

    section: ClassVar[str] = ""


OptionsT = TypeVar("OptionsT", bound=TargetOptions)


def _registered_options() -> tuple[type[TargetOptions], ...]:
    """The registered settings classes (imported by path: see core/targets.py)."""
    return typing.cast("tuple[type[TargetOptions], ...]", target_config_classes())


@dataclass(frozen=True)
class TargetConfig:
    kind: str = field(default="spark", metadata=one_of(*TARGET_KINDS))
    url: str = field(default="", repr=False, metadata=SECRET)
    # Name the primary key of a rejected row in error messages (off: messages
    # reach logs, and a key can be personal data; rows are never printed).
    show_keys: bool = False
    # The targets' own settings (TargetOptions), one of each registered class
    # when read from a file; a class missing here reads as its defaults.
    options: tuple[TargetOptions, ...] = field(default=(), metadata={"internal": True, "options": _registered_options})

    def of(self, cls: type[OptionsT]) -> OptionsT:
        """The settings of type ``cls`` (its defaults when none were given)."""
        for opt in self.options:
            if isinstance(opt, cls):
                return opt
        return cls()

    def with_options(self, *opts: TargetOptions) -> TargetConfig:
        """A copy with ``opts`` in place of the settings of their classes."""
        kept = tuple(o for o in self.options if not any(type(o) is type(n) for n in opts))
        return dataclasses.replace(self, options=kept + opts)


@dataclass(frozen=True)
class SnapshotConfig:
    """Full-state capture (cynomys/snapshot): DBLog watermarks, or GTID
    watermarks with ``read_only`` (no writes to the source)."""

    # Rows per chunk select; 0: a snapshot sizes its chunks to about
    # chunk_bytes of the table's average row (information_schema), verify
    # reads 20000 rows a chunk (verify/coordinator.py VERIFY_CHUNK_ROWS).
    chunk_size: int = field(default=0, metadata=NON_NEGATIVE)
    chunk_bytes: int = field(default=4 * 1024 * 1024, metadata=POSITIVE)
    # Chunk selects of a snapshot run on this many reader threads, each with
    # its own source connection (snapshot/readers.py).
    max_connections: int = field(default=2, metadata=POSITIVE)
    watermark_schema: str = "cynomys_meta"
    read_only: bool = False
    # A requested snapshot of a keyless table clears the target table and
    # reloads it (snapshot/keyless.py): only when asked for.  The initial
    # snapshot reads keyless tables without it (their target tables are new).
    allow_no_primary_key: bool = False
    throttle_ms: int = field(default=0, metadata=NON_NEGATIVE)
    # On the producer's first start (no checkpoint) with [source] start =
    # "current", snapshot every included table: the binlog before that point
    # is not read, so a new target would otherwise miss the existing rows.
    initial: bool = True
    # The driver of chunk selects (snapshot/source.py): "auto" is mysqlclient
    # (C, ~4x pymysql's rows/s here) when installed and the source has no
    # TLS, else pymysql; both give the same values.
    driver: str = field(default="auto", metadata=one_of("auto", "mysqlclient", "pymysql"))
    # Snapshot and verify chunk selects run on this replica of the source
    # ("host:port", with the [source] user, password and TLS settings); each
    # waits until the replica has applied its low watermark
    # (snapshot/replica.py).  "": the source.  Keyless tables' whole-table
    # reads stay on the source.
    read_from: str = field(default="", metadata=checked(lambda v: _listen_ok(v), '"" (the source) or "host:port" '
                                                                               'of a replica of the source'))
    # How long a chunk waits for that replica to apply its low watermark
    # before the producer reports it lagging (a warning; the chunk is read
    # again with new watermarks while the log goes on).
    replica_wait_s: float = field(default=30.0, metadata=POSITIVE)


def _listen_ok(v: str) -> bool:
    """"" (off) or "host:port" with a TCP port; the host may be an IPv6
    literal in brackets ("[::1]:9108")."""
    if v == "":
        return True
    host, sep, port = v.rpartition(":")
    return bool(sep and host) and port.isdigit() and 0 < int(port) < 65536


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus metrics and the health endpoint of a daemon (cynomys/metrics).
    Off unless ``listen`` is set.  Both daemons read this section; when they
    share a config file on one host, give one of them another address with
    CYNOMYS_METRICS_LISTEN."""

    listen: str = field(default="", metadata=checked(_listen_ok, '"" (off) or "host:port", e.g. "127.0.0.1:9108"'))
    # How often the daemon checks its source (producer) or target (applier)
    # is reachable; a loop without progress for stall_intervals of these is
    # reported stalled.
    health_interval_s: float = field(default=5.0, metadata=POSITIVE)
    stall_intervals: int = field(default=2, metadata=POSITIVE)
    # /healthz turns unhealthy when the daemon's lag exceeds this (0: no limit).
    max_lag_s: float = field(default=300.0, metadata=NON_NEGATIVE)


@dataclass(frozen=True)
class LogConfig:
    level: str = field(default="INFO", metadata=one_of("DEBUG", "INFO", "WARNING", "ERROR"))


#: Schema-change policies ([shape] schema_changes and per target table): what
#: a source DDL may do to a target table (cynomys/shape/policy.py).
SCHEMA_CHANGES = ("evolve", "ignore_drops", "freeze", "stop")
#: Applier modes per target table (cynomys/shape/modes.py).
MODES = ("upsert", "soft_delete", "history")


def _ident_ok(v: str) -> bool:
    return bool(v) and len(v) <= 64 and "`" not in v


IDENT = checked(_ident_ok, "a column name of 1-64 characters without backticks")


@dataclass(frozen=True)
class RouteRule:
    """One ``[[shape.route]]`` rule (producer): source tables whose
    ``db.table`` matches ``source`` are written to the table ``target``
    names.  Rules are tried in file order; the first match wins.  A rule
    whose target does not tell its sources apart (a pattern matching many
    tables, and a target that does not use every capture group) merges
    them: the source database and table become columns of the target table
    (``database_column``, ``table_column``) and lead its primary key."""

    # Source tables: a glob on "db.table" ("shop_*.orders"; each * and ? is a
    # capture group, \1 \2 ... in target), or a regular expression after
    # "re:" matched against the whole name ("re:shop_(\d+)\.orders").
    source: str = field(default="", metadata={**checked(bool, "a pattern on 'db.table'"), "required": True})
    # The target table "db.table"; \1 (or \g<name>) stands for a capture group.
    target: str = field(default="", metadata={**checked(bool, "a table 'db.table'"), "required": True})
    # Merging routes: the column holding each row's source database ("" = none).
    database_column: str = "source_db"
    # Merging routes: the column holding each row's source table ("" = none).
    table_column: str = "source_table"


@dataclass(frozen=True)
class TableRule:
    """``[shape.tables."<pattern>"]`` (producer): the columns and rows of
    the source tables whose ``db.table`` matches the glob ``<pattern>``
    (the first matching entry in file order applies).  Column names are the
    source's; masking happens on the source host, so a masked value never
    travels nor reaches the target."""

    # Columns to keep (empty: every column); primary-key columns must be kept.
    include: list[str] = field(default_factory=list)
    # Columns to leave out; primary-key columns cannot be left out.
    exclude: list[str] = field(default_factory=list)
    # Source column -> its name on the target.
    rename: dict[str, str] = field(default_factory=dict)
    # Source column -> mask: "hash" (HMAC-SHA256 with [shape] mask_key, 64
    # hex characters, type char(64)), "hash:N" (its first N hex characters),
    # "hash_int" (a bigint from the HMAC), "null", "const:TEXT", "truncate:N".
    mask: dict[str, str] = field(default_factory=dict)
    # Rows to keep: an SQL predicate on the source row ("tenant_id = 42 AND
    # status <> 'test'"); a row moving in or out becomes an insert or a delete.
    filter: str = ""


@dataclass(frozen=True)
class TargetRule:
    """``[shape.targets."<pattern>"]`` (applier): how the target tables
    whose ``db.table`` matches the glob ``<pattern>`` are written (the first
    matching entry in file order applies)."""

    # "upsert": the table mirrors the source; "soft_delete": deleted rows stay,
    # flagged; "history": every change is appended as a row (a changelog).
    mode: str = field(default="upsert", metadata=one_of(*MODES))
    # What a source DDL may do to these tables ("" = [shape] schema_changes).
    schema_changes: str = field(default="", metadata=one_of("", *SCHEMA_CHANGES))


@dataclass(frozen=True)
class ShapeConfig:
    """Shaping data on the way (docs/guides/shaping.md): routing, column
    choice, masking and row filters run in the producer, before anything
    leaves the source host; modes (soft delete, history) and the
    schema-change policy run in the applier, where the target is."""

    # Key of the "hash" masks (HMAC-SHA256), at least 16 characters; set it
    # as CYNOMYS_SHAPE_MASK_KEY on the producer's host (the applier never needs it).
    mask_key: str = field(default="", repr=False, metadata=SECRET)
    # Producer: source DDL statements (exact text, or their position
    # "file:pos") the shaping stage drops instead of stopping on them.
    skip_ddl: list[str] = field(default_factory=list)
    # Applier: the schema-change policy of target tables without their own.
    schema_changes: str = field(default="evolve", metadata=one_of(*SCHEMA_CHANGES))
    # soft_delete: the flag column (1 once the source row is deleted).  The
    # defaults avoid names Iceberg keeps for itself (_deleted, _pos, _file).
    deleted_column: str = field(default="_cdc_deleted", metadata=IDENT)
    # soft_delete and history: the column holding the source commit time (UTC).
    commit_time_column: str = field(default="_cdc_commit_time", metadata=IDENT)
    # history: the column holding the change (INSERT, UPDATE, DELETE, READ).
    op_column: str = field(default="_cdc_op", metadata=IDENT)
    # history: the source transaction (its GTID, else "file:pos" of its start); with seq_column the key.
    txn_column: str = field(default="_cdc_txn", metadata=IDENT)
    # history: the binlog file of the transaction's start.
    file_column: str = field(default="_cdc_binlog_file", metadata=IDENT)
    # history: the binlog position of the transaction's start.
    pos_column: str = field(default="_cdc_binlog_pos", metadata=IDENT)
    # history: the change's number within its transaction and table (from 0).
    seq_column: str = field(default="_cdc_seq", metadata=IDENT)
    # history: the prefix of the columns holding the before image.
    before_prefix: str = field(default="_cdc_before_", metadata=IDENT)
    route: list[RouteRule] = field(default_factory=list)
    tables: dict[str, TableRule] = field(default_factory=dict)
    targets: dict[str, TargetRule] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        """Any shaping configured at all."""
        return bool(self.route or self.tables or self.targets or self.schema_changes != "evolve")


@dataclass(frozen=True)
class Config:
    source: SourceConfig = field(default_factory=SourceConfig)
    producer: ProducerConfig = field(default_factory=ProducerConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    applier: ApplierConfig = field(default_factory=ApplierConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    shape: ShapeConfig = field(default_factory=ShapeConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    log: LogConfig = field(default_factory=LogConfig)
    path: str = field(default="<defaults>", compare=False, metadata={"internal": True})

    def resolve(self, relative: str) -> Path:
        """A path from the file, taken relative to the config file's folder."""
        p = Path(os.path.expanduser(relative))
        if p.is_absolute() or self.path.startswith("<"):
            return p
        return Path(self.path).parent / p


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if origin is list:
        (item,) = typing.get_args(tp)
        return isinstance(value, list) and all(_type_ok(v, item) for v in value)
    if origin is dict:
        _, item = typing.get_args(tp)
        return isinstance(value, dict) and all(_type_ok(v, item) for v in value.values())
    raise TypeError(f"unsupported config type {tp!r}")


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _expected(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is list:
        return "a list of " + _plural(typing.get_args(tp)[0])
    if origin is dict:
        return "a table of " + _plural(typing.get_args(tp)[1])
    return _TYPE_WORDS[tp]


def _plural(tp: Any) -> str:
    """'strings', 'lists of strings', 'tables of strings' (a nested type in an error)."""
    return _expected(tp).split(" ", 1)[-1].replace("list of", "lists of").replace("table of", "tables of", 1) \
        if typing.get_origin(tp) in (list, dict) else _expected(tp).split(" ", 1)[-1] + "s"


def _from_env(raw: str, tp: Any, name: str, where: str, secret: bool = False) -> Any:
    """Parse an environment override into the field's type."""
    try:
        if tp is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if tp is int:
            return int(raw)
        if tp is float:
            return float(raw)
        if tp is str:
            return raw
        if typing.get_origin(tp) is list:
            return [s.strip() for s in raw.split(",") if s.strip()]
    except ValueError:
        pass
    raise ConfigError(f"environment variable {name} (for {where}): expected {_expected(tp)}, "
                      f"got {'***' if secret else repr(raw)}")


def _build(cls: type, data: Mapping[str, Any], section: str, file: str, env: Mapping[str, str]) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    # A section that carries the targets' own settings (TargetConfig.options):
    # their keys are keys of this section ('' section) or sub-tables of it.
    holder = next((f for f in dataclasses.fields(cls) if f.metadata.get("options")), None)
    extras: tuple[type[TargetOptions], ...] = holder.metadata["options"]() if holder is not None else ()
    flat = {f.name: ext for ext in extras if not ext.section for f in dataclasses.fields(typing.cast(Any, ext))}
    tables = {ext.section for ext in extras if ext.section}
    for key in data:
        if key not in fields and key not in flat and key not in tables:
            known = ", ".join(sorted({*fields, *flat, *tables}))
            raise ConfigError(
                f"unknown key [{section}] {key} in {file}",
                hint=f"known keys of [{section}]: {known}",
            )
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        tp = hints[name]
        where = f"[{section}] {name}" if section else f"[{name}]"
        sub = f"{section}.{name}" if section else name
        if dataclasses.is_dataclass(tp):
            raw = data.get(name, {})
            if not isinstance(raw, dict):
                raise ConfigError(f"{where} in {file}: expected a table [{sub}]")
            kwargs[name] = _build(typing.cast(type, tp), raw, sub, file, env)
            continue
        item_cls = _table_items(tp)
        if item_cls is not None:
            if name in data:
                kwargs[name] = _build_items(tp, item_cls, data[name], where, sub, file)
            continue
        env_name = "CYNOMYS_" + sub.replace(".", "_").upper()
        secret = bool(f.metadata.get("secret"))
        if env_name in env:
            value = _from_env(env[env_name], tp, env_name, where, secret)
        elif name in data:
            value = data[name]
            if not _type_ok(value, tp):
                # A password of the wrong type is still a password: name its type only.
                shown = f"a {type(value).__name__}" if secret else repr(value)
                raise ConfigError(f"{where} in {file}: expected {_expected(tp)}, got {shown}")
            if tp is float:
                value = float(value)
        else:
            if f.metadata.get("required"):
                raise ConfigError(f"{where} in {file} is required", hint=f.metadata["check"][1])
            continue
        check: Check | None = f.metadata.get("check")
        if check is not None and not check[0](value):
            shown = "***" if secret else repr(value)
            raise ConfigError(f"{where} in {file}: expected {check[1]}, got {shown}")
        kwargs[name] = value
    if holder is not None:
        kwargs[holder.name] = tuple(_build_options(ext, data, section, file, env) for ext in extras)
    obj = cls(**kwargs)
    # Keys that are valid alone but not together (e.g. [applier] partition
    # and partitions): the section says what is wrong.
    cross = getattr(obj, "cross_check", None)
    problem = cross() if cross is not None else None
    if problem:
        raise ConfigError(f"[{section}] {problem} (in {file})")
    return obj


def _table_items(tp: Any) -> type | None:
    """The dataclass of a list of tables (``[[shape.route]]``) or of a table
    of tables (``[shape.tables."db.t"]``), else None."""
    origin = typing.get_origin(tp)
    if origin not in (list, dict):
        return None
    item = typing.get_args(tp)[-1]
    return typing.cast(type, item) if dataclasses.is_dataclass(item) else None


def _build_items(tp: Any, cls: type, raw: Any, where: str, sub: str, file: str) -> Any:
    """Each table of a ``[[section.name]]`` list or a ``[section.name."key"]``
    table, validated like a section (named ``[section.name.1]``,
    ``[section.name."key"]`` in errors).  Not overridden from the environment:
    a list of tables has no variable names."""
    if typing.get_origin(tp) is list:
        if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
            raise ConfigError(f"{where} in {file}: expected a list of tables [[{sub}]]")
        return [_build(cls, x, f"{sub}.{i + 1}", file, {}) for i, x in enumerate(raw)]
    if not isinstance(raw, dict) or not all(isinstance(x, dict) for x in raw.values()):
        raise ConfigError(f"{where} in {file}: expected tables [{sub}.\"<name>\"]")
    return {k: _build(cls, x, f'{sub}."{k}"', file, {}) for k, x in raw.items()}


def _build_options(cls: type[TargetOptions], data: Mapping[str, Any], section: str, file: str,
                   env: Mapping[str, str]) -> TargetOptions:
    """One target's settings, from the table ``[section.<cls.section>]`` or,
    for ``section = ''``, from the keys of ``[section]`` that are its fields."""
    if not cls.section:
        mine = {f.name for f in dataclasses.fields(typing.cast(Any, cls))}
        return typing.cast(TargetOptions, _build(cls, {k: v for k, v in data.items() if k in mine}, section, file, env))
    raw = data.get(cls.section, {})
    sub = f"{section}.{cls.section}"
    if not isinstance(raw, dict):
        raise ConfigError(f"[{section}] {cls.section} in {file}: expected a table [{sub}]")
    return typing.cast(TargetOptions, _build(cls, raw, sub, file, env))


def load_config(path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate a TOML file (or only defaults + env when ``path`` is None)."""
    env = os.environ if env is None else env
    if path is None:
        cfg: Config = _build(Config, {}, "", "<defaults>", env)
        return cfg
    file = str(path)
    try:
        with open(file, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {file} not found", hint="pass -c PATH to an existing TOML file") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {file} is a directory", hint="pass -c the TOML file itself") from None
    except PermissionError:
        raise ConfigError(f"config file {file} cannot be read: permission denied",
                          hint="let this user read it (chmod/chown), or run as its owner") from None
    except OSError as exc:
        raise ConfigError(f"config file {file} cannot be read: {exc.strerror or exc}",
                          hint="pass -c PATH to a readable TOML file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {file} is not UTF-8 text (byte {exc.start}: {exc.reason})",
                          hint="save it as UTF-8 (TOML files are UTF-8)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file} is not valid TOML: {exc}") from None
    cfg = _build(Config, data, "", file, env)
    resolved: Config = _resolve_paths(dataclasses.replace(cfg, path=os.path.abspath(file)))
    return resolved


def _resolve_paths(cfg: Any) -> Any:
    """Fields marked as paths, made absolute against the config file's folder."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            sub = _resolve_paths_in(value, cfg)
            if sub is not value:
                changes[f.name] = sub
    return dataclasses.replace(cfg, **changes) if changes else cfg


def _resolve_paths_in(section: Any, cfg: Config) -> Any:
    changes: dict[str, Any] = {f.name: str(cfg.resolve(getattr(section, f.name))) for f in dataclasses.fields(section)
                               if f.metadata.get("path") and getattr(section, f.name)}
    for f in dataclasses.fields(section):
        if f.metadata.get("options"):  # the targets' own settings
            opts = getattr(section, f.name)
            resolved = tuple(_resolve_paths_in(o, cfg) for o in opts)
            if any(a is not b for a, b in zip(resolved, opts)):
                changes[f.name] = resolved
    return dataclasses.replace(section, **changes) if changes else section
