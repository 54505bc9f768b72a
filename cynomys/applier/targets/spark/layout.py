"""The layout of each Iceberg table, from ``[target.spark]``: partition spec,
sort order, table properties and format version, per table or by pattern.

Pure data and text (no Spark import): ``session.session_conf`` checks the
keys with it when the target is built, so a bad transform stops ``cynomys
config check`` and the applier's start instead of the first flush.  The target renders it into ``CREATE TABLE`` and compares it
with the tables it already has (``differences``): a table created before the
config changed is either refused (``layout_changes = "refuse"``, the default:
one line naming the table, what differs and the fix) or changed in place
(``"evolve"``: Iceberg partition evolution, a new write order, properties,
a format upgrade -- metadata only; files already written keep the layout
they were written with until compaction rewrites them).

Keys name tables as ``<db>.<table>`` with shell wildcards (``shop.*``,
``*.orders``).  For ``partition_by`` and ``sort_by`` an exact name wins, else
the first pattern written that matches; ``table_properties`` merges every
match, patterns in the order written, then the exact name.

Transforms are Iceberg's, written as in Spark SQL: ``col`` (identity),
``bucket(N, col)``, ``truncate(W, col)``, ``years(col)``, ``months(col)``,
``days(col)``, ``hours(col)`` (``year``/``month``/``day``/``hour`` too).  A
sort field is ``col``, ``col DESC``, ``col ASC NULLS LAST``...: the order of
each data file written (``WRITE LOCALLY ORDERED BY``, so flushes add no
shuffle), which lets readers skip row groups and files by their bounds.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    from cynomys.applier.targets.spark.config import SparkConfig

#: Table properties Cynomys manages itself; a config that sets them would
#: break merge-on-read flushes or exactly-once (``target.py``).
RESERVED_PROPERTIES = frozenset({
    "write.delete.mode", "write.update.mode", "write.merge.mode", "cynomys.primary-key",
})
FORMAT_VERSIONS = (2, 3)

#: Spark SQL transform name -> Iceberg's name in a partition spec
#: (``PartitionField.transform().toString()`` prints ``bucket[16]``, ``day``...).
_TRANSFORMS = {
    "identity": "identity", "bucket": "bucket", "truncate": "truncate",
    "years": "year", "year": "year", "months": "month", "month": "month",
    "days": "day", "day": "day", "date": "day", "hours": "hour", "hour": "hour",
}
_WITH_ARG = frozenset({"bucket", "truncate"})
_NAME = r"[A-Za-z_][A-Za-z0-9_]*|`(?:[^`]|``)+`"
_CALL = re.compile(rf"^\s*(?P<fn>[A-Za-z_]+)\s*\(\s*(?:(?P<n>\d+)\s*,\s*)?(?P<col>{_NAME})\s*\)\s*$")
_PLAIN = re.compile(rf"^\s*(?P<col>{_NAME})\s*$")
_SORT = re.compile(rf"^\s*(?P<col>{_NAME})(?:\s+(?P<dir>ASC|DESC))?(?:\s+NULLS\s+(?P<nulls>FIRST|LAST))?\s*$",
                   re.IGNORECASE)


def _unquote(name: str) -> str:
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class PartitionField:
    """One field of a partition spec: an Iceberg transform of a column."""

    transform: str        # Iceberg's name: identity, bucket, truncate, year, month, day, hour
    column: str
    arg: int | None = None  # bucket count / truncate width

    @classmethod
    def parse(cls, text: str) -> PartitionField:
        plain = _PLAIN.match(text)
        if plain:
            return cls("identity", _unquote(plain["col"]))
        m = _CALL.match(text)
        fn = m["fn"].lower() if m else ""
        if not m or fn not in _TRANSFORMS:
            raise ValueError(f"{text!r} is not a partition transform: use col, bucket(N, col), truncate(W, col), "
                             "years(col), months(col), days(col) or hours(col)")
        name = _TRANSFORMS[fn]
        if (name in _WITH_ARG) != (m["n"] is not None):
            raise ValueError(f"{text!r}: {fn} takes " + ("a number and a column" if name in _WITH_ARG
                                                           else "one column"))
        arg = int(m["n"]) if m["n"] is not None else None
        if arg is not None and arg <= 0:
            raise ValueError(f"{text!r}: {fn} needs a positive number")
        return cls(name, _unquote(m["col"]), arg)

    @classmethod
    def of_iceberg(cls, text: str) -> PartitionField:
        """From the ``iceberg`` form (``bucket[16](id)``, ``day(ts)``)."""
        m = re.match(r"^(?P<t>[a-z]+)(?:\[(?P<n>\d+)\])?\((?P<col>.+)\)$", text)
        if not m:
            raise ValueError(f"{text!r} is not an Iceberg partition field")
        return cls(m["t"], m["col"], int(m["n"]) if m["n"] else None)

    @property
    def sql(self) -> str:
        """As Spark SQL writes it (``PARTITIONED BY``, ``ADD PARTITION FIELD``)."""
        col = _quote(self.column)
        if self.transform == "identity":
            return col
        if self.arg is not None:
            return f"{self.transform}({self.arg}, {col})"
        return f"{self.transform}s({col})"

    @property
    def iceberg(self) -> str:
        """As Iceberg prints it (``bucket[16](id)``): what ``differences`` compares."""
        name = f"{self.transform}[{self.arg}]" if self.arg is not None else self.transform
        return f"{name}({self.column.lower()})"


@dataclass(frozen=True)
class SortField:
    """One field of a sort order (identity transforms only)."""

    column: str
    descending: bool = False
    nulls_first: bool = True  # Iceberg's default for ASC; DESC defaults to NULLS LAST

    @classmethod
    def parse(cls, text: str) -> SortField:
        m = _SORT.match(text)
        if not m:
            raise ValueError(f"{text!r} is not a sort field: use col, col DESC, col ASC NULLS LAST ...")
        desc = (m["dir"] or "ASC").upper() == "DESC"
        nulls = m["nulls"].upper() == "FIRST" if m["nulls"] else not desc
        return cls(_unquote(m["col"]), desc, nulls)

    @property
    def sql(self) -> str:
        return f"{_quote(self.column)} {'DESC' if self.descending else 'ASC'} " \
               f"NULLS {'FIRST' if self.nulls_first else 'LAST'}"

    @property
    def iceberg(self) -> str:
        return f"{self.column.lower()} {'DESC' if self.descending else 'ASC'} " \
               f"NULLS_{'FIRST' if self.nulls_first else 'LAST'}"


@dataclass(frozen=True)
class TableLayout:
    """What a table should look like: what ``CREATE TABLE`` says and what an
    existing table is compared with."""

    partition: tuple[PartitionField, ...] = ()
    sort: tuple[SortField, ...] = ()
    format_version: int = 2
    #: Properties the config sets (Cynomys's own come on top: ``SparkTarget.table_properties``).
    properties: Mapping[str, str] = field(default_factory=dict)
    #: The format version was set for this table (``format-version`` in
    #: ``table_properties``), not only the default of new tables
    #: (``format_version``): only then is an existing table held to it.
    format_pinned: bool = False

    def partition_sql(self) -> str:
        return f" PARTITIONED BY ({', '.join(p.sql for p in self.partition)})" if self.partition else ""

    def sort_sql(self) -> str:
        """The ``ALTER TABLE`` tail setting the write order (or dropping it)."""
        if not self.sort:
            return "WRITE UNORDERED"
        return "WRITE LOCALLY ORDERED BY " + ", ".join(s.sql for s in self.sort)

    def columns(self) -> set[str]:
        return {p.column.lower() for p in self.partition} | {s.column.lower() for s in self.sort}


@dataclass(frozen=True)
class Existing:
    """An existing table's layout as Iceberg reports it (``IcebergApi.layout``)."""

    partition: tuple[str, ...]     # PartitionField.iceberg forms, void fields left out
    sort: tuple[str, ...]          # SortField.iceberg forms
    format_version: int
    properties: Mapping[str, str]


def _match(patterns: Mapping[str, object], name: str) -> list[str]:
    """The keys of ``patterns`` that match ``name``: patterns in the order written, then the exact name."""
    low = name.lower()
    globs = [k for k in patterns if k.lower() != low and fnmatch.fnmatchcase(low, k.lower())]
    exact = [k for k in patterns if k.lower() == low]
    return globs + exact


def _pick(patterns: Mapping[str, Sequence[str]], name: str) -> Sequence[str]:
    found = _match(patterns, name)
    if not found:
        return ()
    exact = [k for k in found if k.lower() == name.lower()]
    return patterns[exact[0] if exact else found[0]]


def check(partition_by: Mapping[str, Sequence[str]], sort_by: Mapping[str, Sequence[str]],
          table_properties: Mapping[str, Mapping[str, str]], format_version: int) -> str | None:
    """What is wrong with these keys of [target.spark], or None."""
    for key, texts in partition_by.items():
        try:
            fields = [PartitionField.parse(t) for t in texts]
        except ValueError as exc:
            return f"partition_by[{key!r}]: {exc}"
        seen = [f.iceberg for f in fields]
        if len(set(seen)) < len(seen):
            return f"partition_by[{key!r}] names the same transform twice"
    for key, texts in sort_by.items():
        try:
            for t in texts:
                SortField.parse(t)
        except ValueError as exc:
            return f"sort_by[{key!r}]: {exc}"
    for key, props in table_properties.items():
        reserved = sorted(RESERVED_PROPERTIES & set(props))
        if reserved:
            return (f"table_properties[{key!r}] sets {', '.join(reserved)}, which Cynomys manages "
                    "(merge-on-read flushes, the primary key)")
        fv = props.get("format-version")
        if fv is not None and fv not in {str(v) for v in FORMAT_VERSIONS}:
            return f"table_properties[{key!r}]: format-version {fv!r} is not one of {FORMAT_VERSIONS}"
    if format_version not in FORMAT_VERSIONS:
        return f"format_version = {format_version} is not one of {FORMAT_VERSIONS}"
    return None


def of(sc: SparkConfig, database: str, table: str) -> TableLayout:
    """The layout [target.spark] asks for table ``database.table``."""
    return layout_for(f"{database}.{table}", sc.partition_by, sc.sort_by, sc.table_properties, sc.format_version)


def layout_for(name: str, partition_by: Mapping[str, Sequence[str]], sort_by: Mapping[str, Sequence[str]],
               table_properties: Mapping[str, Mapping[str, str]], format_version: int) -> TableLayout:
    """The layout of table ``name`` (``db.table``) the keys ask for."""
    props: dict[str, str] = {}
    for key in _match(table_properties, name):
        props.update(table_properties[key])
    pinned = "format-version" in props
    version = int(props.pop("format-version", format_version))
    return TableLayout(
        partition=tuple(PartitionField.parse(t) for t in _pick(partition_by, name)),
        sort=tuple(SortField.parse(t) for t in _pick(sort_by, name)),
        format_version=version,
        properties=props,
        format_pinned=pinned,
    )


def differences(want: TableLayout, have: Existing) -> list[str]:
    """What differs between the layout asked for and the table's, in words
    (empty when they agree).  Properties the table has and the config does
    not name are not differences (Cynomys's own, or set by an operator)."""
    out: list[str] = []
    spec = tuple(p.iceberg for p in want.partition)
    if spec != have.partition:
        out.append(f"partition spec [{', '.join(have.partition)}] -> [{', '.join(spec)}]")
    order = tuple(s.iceberg for s in want.sort)
    if order != have.sort:
        out.append(f"sort order [{', '.join(have.sort)}] -> [{', '.join(order)}]")
    if want.format_pinned and want.format_version != have.format_version:
        # [target.spark] format_version alone is the version of *new* tables:
        # changing the default never touches the tables there are.
        out.append(f"format version {have.format_version} -> {want.format_version}")
    changed = sorted(k for k, v in want.properties.items() if have.properties.get(k) != v)
    if changed:
        out.append("properties " + ", ".join(f"{k}={have.properties.get(k)!r}->{want.properties[k]!r}"
                                            for k in changed))
    return out
