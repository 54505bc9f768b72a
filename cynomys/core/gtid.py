"""Executed-GTID sets: the one order that holds across servers.

Binlog positions (file:pos) mean something on one server only; after a
failover the new primary numbers its files its own way.  GTIDs are the
order replication itself keeps across servers, so Cynomys uses them for
the read-only snapshot watermarks (Debezium) and for admitting changes
from another server than the one the target's state was written from
(applier/admit.py).

Two flavours, both answering ``contains(gtid)`` for the GTID a transaction
carries in the binlog (``SourceEvent.gtid`` on BEGIN, ``Change.tid``):

- MariaDB ``@@gtid_binlog_pos``: the last GTID per replication domain,
  ``domain-server-seq[,domain-server-seq...]``.  Within one domain sequence
  numbers grow in binlog order, so ``d-s-n`` is contained when the set's
  sequence for domain ``d`` is at least ``n`` (whatever the server id: a
  failover keeps numbering the domain).
- MySQL ``@@gtid_executed``: per source UUID (optionally with a tag, MySQL
  8.3+) a list of intervals, ``uuid:1-5:7-9[:tag:1-3],uuid2:1-3``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from cynomys.core.errors import TerminalError

_MARIADB_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")
_MYSQL_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}:")


class GtidError(TerminalError):
    """A text that should be a GTID position or set is not one."""


@dataclass(frozen=True)
class GtidSet:
    """An executed-GTID set.  ``seqs`` (MariaDB): domain -> highest seq;
    ``intervals`` (MySQL): 'uuid' or 'uuid:tag' -> sorted inclusive ranges."""

    flavor: str
    text: str
    seqs: tuple[tuple[int, int], ...] = ()
    intervals: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()

    # -- parsing -----------------------------------------------------------
    @classmethod
    def parse(cls, flavor: str, text: str) -> GtidSet:
        if flavor == "mariadb":
            return cls.parse_mariadb(text)
        if flavor == "mysql":
            return cls.parse_mysql(text)
        raise ValueError(f"unknown GTID flavour {flavor!r}")

    @classmethod
    def parse_mariadb(cls, text: str) -> GtidSet:
        seqs: dict[int, int] = {}
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            m = _MARIADB_GTID.match(part)
            if m is None:
                raise GtidError(f"not a MariaDB GTID position: {text!r} (part {part!r})")
            domain, seq = int(m.group(1)), int(m.group(3))
            seqs[domain] = max(seq, seqs.get(domain, 0))
        return cls("mariadb", text.strip(), seqs=tuple(sorted(seqs.items())))

    @classmethod
    def parse_mysql(cls, text: str) -> GtidSet:
        found: dict[str, list[tuple[int, int]]] = {}
        for part in (p.strip() for p in text.replace("\n", "").split(",")):
            if not part:
                continue
            tokens = part.split(":")
            source, current = tokens[0].lower(), tokens[0].lower()
            for tok in tokens[1:]:
                lo, sep, hi = tok.partition("-")
                if lo.isdigit() and (not sep or hi.isdigit()):
                    found.setdefault(current, []).append((int(lo), int(hi) if sep else int(lo)))
                elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,31}", tok):
                    current = f"{source}:{tok.lower()}"
                else:
                    raise GtidError(f"not a MySQL GTID set: {text!r} (token {tok!r})")
        return cls("mysql", text.strip(), intervals=tuple(
            (k, tuple(sorted(v))) for k, v in sorted(found.items())))

    # -- membership --------------------------------------------------------
    def contains(self, gtid: str) -> bool:
        """True when the transaction ``gtid`` is in the set.  A text that is
        not a GTID (a ``file:pos`` tid of a server without GTIDs) is not."""
        if self.flavor == "mariadb":
            m = _MARIADB_GTID.match(gtid)
            if m is None:
                return False
            have = dict(self.seqs).get(int(m.group(1)))
            return have is not None and int(m.group(3)) <= have
        source, sep, num = gtid.rpartition(":")
        if not sep or not num.isdigit():
            return False
        n = int(num)
        return any(lo <= n <= hi for lo, hi in dict(self.intervals).get(source.lower(), ()))

    def covers(self, other: GtidSet) -> bool:
        """Every transaction of ``other`` is in this set: for MariaDB, each
        domain of ``other`` is here with at least its sequence; for MySQL,
        each of ``other``'s intervals lies inside one of ours."""
        if self.flavor != other.flavor:
            return False
        if self.flavor == "mariadb":
            mine = dict(self.seqs)
            return all(d in mine and mine[d] >= n for d, n in other.seqs)
        mine_iv = dict(self.intervals)
        return all(any(a <= lo and hi <= b for a, b in mine_iv.get(src, ()))
                   for src, ivs in other.intervals for lo, hi in ivs)

    @property
    def empty(self) -> bool:
        return not self.seqs and not self.intervals

    def __str__(self) -> str:
        return self.text or "(empty)"


def mariadb_seq(gtid: str) -> tuple[int, int] | None:
    """(domain, seq) of one MariaDB GTID ``d-s-n``; None for anything else."""
    m = _MARIADB_GTID.match(gtid)
    return (int(m.group(1)), int(m.group(3))) if m else None


def flavor_of(text: str) -> str:
    """'mariadb' for ``d-s-n[,...]``, 'mysql' for ``uuid:1-5[,...]``, '' when
    ``text`` is empty or neither."""
    first = text.split(",")[0].strip()
    if _MARIADB_GTID.match(first):
        return "mariadb"
    if _MYSQL_UUID.match(first):
        return "mysql"
    return ""


def parse_any(text: str) -> GtidSet | None:
    """The GTID set ``text`` holds, of whichever flavour; None when empty."""
    flavor = flavor_of(text)
    return GtidSet.parse(flavor, text) if flavor else None
