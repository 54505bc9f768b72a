"""Raw binlog event kinds -> the ten basic types (the paper's data-driven parser).

The Cynomys paper sorts MySQL's event kinds into a handful of basic types
so that the rest of the pipeline handles ten cases, not forty.  The mapping
is a table, not an if-chain: adding a server's new event kind is one row.

========== ==================================================================
basic type what the pipeline does with it
========== ==================================================================
BEGIN      opens a transaction (GTID events carry its GTID)
COMMIT     closes it: its end position is a valid checkpoint
INSERT     row images written (WRITE_ROWS v0/v1/v2)
UPDATE     before/after images (UPDATE_ROWS v0/v1/v2)
DELETE     row images removed (DELETE_ROWS v0/v1/v2)
DDL        a statement that changes schema; replicated as SQL text
TABLE_MAP  describes the table of the next ROWS events (FULL metadata)
ROTATE     the source moved to another binlog file
INFO       carries no data change (format, heartbeat, GTID lists, ...)
HALT       cannot be replicated faithfully: stop with a clear message
========== ==================================================================

A container (MariaDB's compressed events) is unpacked into the event it
stands for, which is then sorted like any other (``Kind.decoder``); so is
MySQL's TRANSACTION_PAYLOAD (zstd) into the events of its transaction.

QUERY events need their statement text to be sorted; that second table is
``QUERY_RULES``.  An unknown kind is HALT: we cannot know that it does not
touch data, and a silent skip is the failure users of other tools fear most.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Iterator


class Basic(str, Enum):
    BEGIN = "BEGIN"
    COMMIT = "COMMIT"
    INSERT = "INSERT"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    DDL = "DDL"
    TABLE_MAP = "TABLE_MAP"
    ROTATE = "ROTATE"
    INFO = "INFO"
    HALT = "HALT"


#: ``Kind.decoder`` values: MariaDB's zlib-compressed QUERY and ROWS events,
#: MySQL's zstd TRANSACTION_PAYLOAD (containers), and MySQL events whose
#: bytes Cynomys reads itself (parser/mysql8.py).
MARIADB_ZLIB = "mariadb-zlib"
ZSTD_PAYLOAD = "zstd-payload"
MYSQL_GTID = "mysql-gtid"
MYSQL_GTID_TAGGED = "mysql-gtid-tagged"
PREVIOUS_GTIDS = "previous-gtids"


@dataclass(frozen=True)
class Kind:
    code: int
    name: str
    basic: Basic
    why: str  # for HALT: what to do about it
    #: read by Cynomys from the event's bytes, not by mysql-replication: a
    #: container's events are unpacked (parser/containers.py, mysql8.py) and
    #: sorted instead of it (``basic`` is what it holds), a MySQL 8 event
    #: decoded (parser/mysql8.py)
    decoder: str = ""


_STATEMENT_HINT = "set binlog_format=ROW on the source (SET GLOBAL binlog_format=ROW and in its config file)"

#: code -> Kind.  MySQL 5.7/8.x and MariaDB 10.x kinds (libbinlogevents, log_event.h).
KINDS: dict[int, Kind] = {k.code: k for k in (
    Kind(0x00, "UNKNOWN_EVENT", Basic.HALT, "the server wrote an event of unknown kind"),
    Kind(0x01, "START_EVENT_V3", Basic.INFO, ""),
    Kind(0x02, "QUERY_EVENT", Basic.INFO, "sorted by QUERY_RULES"),
    Kind(0x03, "STOP_EVENT", Basic.INFO, ""),
    Kind(0x04, "ROTATE_EVENT", Basic.ROTATE, ""),
    Kind(0x05, "INTVAR_EVENT", Basic.HALT, "statement-based replication context; " + _STATEMENT_HINT),
    Kind(0x06, "LOAD_EVENT", Basic.HALT, "statement-based LOAD DATA; " + _STATEMENT_HINT),
    Kind(0x07, "SLAVE_EVENT", Basic.INFO, ""),
    Kind(0x08, "CREATE_FILE_EVENT", Basic.HALT, "statement-based LOAD DATA; " + _STATEMENT_HINT),
    Kind(0x09, "APPEND_BLOCK_EVENT", Basic.HALT, "statement-based LOAD DATA; " + _STATEMENT_HINT),
    Kind(0x0A, "EXEC_LOAD_EVENT", Basic.HALT, "statement-based LOAD DATA; " + _STATEMENT_HINT),
    Kind(0x0B, "DELETE_FILE_EVENT", Basic.HALT, "statement-based LOAD DATA; " + _STATEMENT_HINT),
    Kind(0x0C, "NEW_LOAD_EVENT", Basic.HALT, "statement-based LOAD DATA; " + _STATEMENT_HINT),
    Kind(0x0D, "RAND_EVENT", Basic.HALT, "statement-based replication context; " + _STATEMENT_HINT),
    Kind(0x0E, "USER_VAR_EVENT", Basic.HALT, "statement-based replication context; " + _STATEMENT_HINT),
    Kind(0x0F, "FORMAT_DESCRIPTION_EVENT", Basic.INFO, ""),
    Kind(0x10, "XID_EVENT", Basic.COMMIT, ""),
    Kind(0x11, "BEGIN_LOAD_QUERY_EVENT", Basic.HALT, "statement-based LOAD DATA; " + _STATEMENT_HINT),
    Kind(0x12, "EXECUTE_LOAD_QUERY_EVENT", Basic.HALT, "statement-based LOAD DATA; " + _STATEMENT_HINT),
    Kind(0x13, "TABLE_MAP_EVENT", Basic.TABLE_MAP, ""),
    Kind(0x14, "PRE_GA_WRITE_ROWS_EVENT", Basic.HALT, "pre-GA row format (MySQL 5.1 beta) is not supported"),
    Kind(0x15, "PRE_GA_UPDATE_ROWS_EVENT", Basic.HALT, "pre-GA row format (MySQL 5.1 beta) is not supported"),
    Kind(0x16, "PRE_GA_DELETE_ROWS_EVENT", Basic.HALT, "pre-GA row format (MySQL 5.1 beta) is not supported"),
    Kind(0x17, "WRITE_ROWS_EVENT_V1", Basic.INSERT, ""),
    Kind(0x18, "UPDATE_ROWS_EVENT_V1", Basic.UPDATE, ""),
    Kind(0x19, "DELETE_ROWS_EVENT_V1", Basic.DELETE, ""),
    Kind(0x1A, "INCIDENT_EVENT", Basic.HALT,
         "the source logged an INCIDENT (changes may be missing from its binlog); "
         "check the source, then re-snapshot the affected tables"),
    Kind(0x1B, "HEARTBEAT_LOG_EVENT", Basic.INFO, ""),
    Kind(0x1C, "IGNORABLE_LOG_EVENT", Basic.INFO, ""),
    Kind(0x1D, "ROWS_QUERY_LOG_EVENT", Basic.INFO, ""),
    Kind(0x1E, "WRITE_ROWS_EVENT_V2", Basic.INSERT, ""),
    Kind(0x1F, "UPDATE_ROWS_EVENT_V2", Basic.UPDATE, ""),
    Kind(0x20, "DELETE_ROWS_EVENT_V2", Basic.DELETE, ""),
    Kind(0x21, "GTID_LOG_EVENT", Basic.BEGIN, "", decoder=MYSQL_GTID),
    Kind(0x22, "ANONYMOUS_GTID_LOG_EVENT", Basic.BEGIN, "", decoder=MYSQL_GTID),
    Kind(0x23, "PREVIOUS_GTIDS_LOG_EVENT", Basic.INFO, "", decoder=PREVIOUS_GTIDS),
    Kind(0x24, "TRANSACTION_CONTEXT_EVENT", Basic.INFO, ""),
    Kind(0x25, "VIEW_CHANGE_EVENT", Basic.INFO, ""),
    Kind(0x26, "XA_PREPARE_LOG_EVENT", Basic.HALT, "XA transactions are not supported; commit them without XA"),
    # JSON diffs applied to the before image (parser/rows.py partial_rows)
    Kind(0x27, "PARTIAL_UPDATE_ROWS_EVENT", Basic.UPDATE, ""),
    Kind(0x28, "TRANSACTION_PAYLOAD_EVENT", Basic.INFO, "", decoder=ZSTD_PAYLOAD),
    Kind(0x29, "HEARTBEAT_LOG_EVENT_V2", Basic.INFO, ""),
    Kind(0x2A, "GTID_TAGGED_LOG_EVENT", Basic.BEGIN, "", decoder=MYSQL_GTID_TAGGED),
    # MariaDB
    Kind(0xA0, "ANNOTATE_ROWS_EVENT", Basic.INFO, ""),
    Kind(0xA1, "BINLOG_CHECKPOINT_EVENT", Basic.INFO, ""),
    Kind(0xA2, "GTID_EVENT", Basic.BEGIN, ""),
    Kind(0xA3, "GTID_LIST_EVENT", Basic.INFO, ""),
    Kind(0xA4, "START_ENCRYPTION_EVENT", Basic.INFO, ""),
    # MariaDB log_bin_compress: zlib inside, unpacked into the plain event (parser/containers.py)
    Kind(0xA5, "QUERY_COMPRESSED_EVENT", Basic.INFO, "sorted by QUERY_RULES once inflated", decoder=MARIADB_ZLIB),
    Kind(0xA6, "WRITE_ROWS_COMPRESSED_EVENT_V1", Basic.INSERT, "", decoder=MARIADB_ZLIB),
    Kind(0xA7, "UPDATE_ROWS_COMPRESSED_EVENT_V1", Basic.UPDATE, "", decoder=MARIADB_ZLIB),
    Kind(0xA8, "DELETE_ROWS_COMPRESSED_EVENT_V1", Basic.DELETE, "", decoder=MARIADB_ZLIB),
    Kind(0xA9, "WRITE_ROWS_COMPRESSED_EVENT", Basic.INSERT, "", decoder=MARIADB_ZLIB),
    Kind(0xAA, "UPDATE_ROWS_COMPRESSED_EVENT", Basic.UPDATE, "", decoder=MARIADB_ZLIB),
    Kind(0xAB, "DELETE_ROWS_COMPRESSED_EVENT", Basic.DELETE, "", decoder=MARIADB_ZLIB),
)}


def kind_of(code: int) -> Kind:
    return KINDS.get(code) or Kind(code, f"EVENT_0x{code:02X}", Basic.HALT,
                                   "an event kind this version of Cynomys does not know; upgrade Cynomys")


@dataclass(frozen=True)
class QueryRule:
    pattern: re.Pattern[str]
    basic: Basic
    why: str = ""


def _rx(words: str) -> re.Pattern[str]:
    return re.compile(r"^\s*(?:/\*.*?\*/\s*)*(?:" + words + r")\b", re.IGNORECASE | re.DOTALL)


#: QUERY event statement -> basic type, first match wins.
QUERY_RULES: tuple[QueryRule, ...] = (
    QueryRule(_rx("BEGIN|START\\s+TRANSACTION"), Basic.BEGIN),
    QueryRule(_rx("COMMIT"), Basic.COMMIT),
    # A ROLLBACK in the binlog ends a transaction whose changes to
    # non-transactional tables did happen; they were logged before it.
    QueryRule(_rx("ROLLBACK(?!\\s+TO)"), Basic.COMMIT),
    QueryRule(_rx("XA"), Basic.HALT, "XA transactions are not supported; commit them without XA"),
    QueryRule(_rx("INSERT|UPDATE|DELETE|REPLACE|LOAD\\s+DATA|CALL|DO"), Basic.HALT,
              "a data change was logged as a statement; " + _STATEMENT_HINT),
    # Temporary tables live in one session of the source; ROW format never
    # logs their rows, so their DDL is not replicated either.
    QueryRule(_rx("(?:CREATE|DROP)\\s+(?:OR\\s+REPLACE\\s+)?TEMPORARY"), Basic.INFO),
    QueryRule(_rx("CREATE\\s+(?:OR\\s+REPLACE\\s+)?TABLE|ALTER\\s+(?:ONLINE\\s+|IGNORE\\s+)*TABLE"
                  "|DROP\\s+TABLES?|RENAME\\s+TABLES?|TRUNCATE|CREATE\\s+(?:OR\\s+REPLACE\\s+)?(?:DATABASE|SCHEMA)"
                  "|DROP\\s+(?:DATABASE|SCHEMA)|ALTER\\s+(?:DATABASE|SCHEMA)"
                  "|CREATE\\s+(?:OR\\s+REPLACE\\s+)?(?:UNIQUE\\s+|FULLTEXT\\s+|SPATIAL\\s+)?INDEX|DROP\\s+INDEX"),
              Basic.DDL),
    # Everything else (GRANT, CREATE USER, SAVEPOINT, FLUSH, views, routines,
    # triggers, events) changes no table rows that the binlog would not also
    # carry as ROWS events.
    QueryRule(re.compile(r""), Basic.INFO),
)


def classify_query(sql: str) -> QueryRule:
    sql = statement_of(sql)
    for rule in QUERY_RULES:
        if rule.pattern.match(sql):
            return rule
    raise AssertionError("QUERY_RULES ends with a catch-all")


#: MariaDB's ``SET STATEMENT var = value [, ...] FOR <statement>``: the binlog
#: keeps the prefix, and the statement after FOR is what ran (``SET STATEMENT
#: lock_wait_timeout = 5 FOR ALTER TABLE ...`` is the usual way to bound an
#: ALTER's metadata lock wait; read as a SET, it was skipped).
_SET_STATEMENT = re.compile(r"^\s*(?:/\*.*?\*/\s*)*SET\s+STATEMENT\b", re.IGNORECASE | re.DOTALL)
_QUOTES = frozenset("'\"`")


#: Executable comments every supported source runs: ``/*! ... */`` and
#: ``/*!NNNNN ... */`` below 50700 (MariaDB runs no 5-digit version from
#: 50700 on -- those are MySQL 5.7+ -- and MySQL runs every version up to its
#: own; checked on MariaDB 10.11).  The server logs them as typed, so
#: ``/*!50100 ALTER TABLE t ADD c INT DEFAULT 3 */`` ran but read as a comment.
#: Others (``/*!80000``, 6-digit versions, MariaDB's ``/*M!``) depend on the
#: server's version and stay comments.
_EXECUTED = re.compile(r"/\*!(?:([0-9]{5})(?![0-9])|(?![0-9]))")
_RUN_BELOW = 50700


def statement_of(sql: str) -> str:
    """The statement a source ran, as Cynomys sorts and parses it: executable
    comments every source runs unwrapped (``_EXECUTED``), then without a
    leading ``SET STATEMENT ... FOR``."""
    if "/*!" in sql:
        sql = _unwrap_executed(sql)
    return _after_set_statement(sql)


def _unwrap_executed(sql: str) -> str:
    out: list[str] = []
    for i, end in _pieces(sql):
        m = _EXECUTED.match(sql, i)
        if m and (m.group(1) is None or int(m.group(1)) < _RUN_BELOW) and sql.endswith("*/", 0, end):
            out.append(" " + sql[m.end():end - 2] + " ")
        else:
            out.append(sql[i:end])
    return "".join(out).strip()


def _pieces(sql: str, i: int = 0) -> Iterator[tuple[int, int]]:
    """(start, end) of each piece of ``sql`` from ``i`` on: a quoted text
    (a backslash escapes in strings, not in `names`; a doubled quote reopens
    the same text), a ``/* comment */`` (unterminated: to the end), or one
    character.  Only a one-character piece is outside quotes and comments."""
    n = len(sql)
    while i < n:
        ch = sql[i]
        if ch in _QUOTES:
            end = i + 1
            while end < n and sql[end] != ch:
                end += 2 if sql[end] == "\\" and ch != "`" else 1
            end += 1  # past the closing quote
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            end = n if end < 0 else end + 2
        else:
            end = i + 1
        yield i, end
        i = end


def _after_set_statement(sql: str) -> str:
    """``sql`` without a leading ``SET STATEMENT ... FOR`` (else ``sql``
    itself): the first FOR outside quotes, comments and parentheses ends the
    prefix (a value may be a string holding 'FOR')."""
    head = _SET_STATEMENT.match(sql)
    if head is None:
        return sql
    depth = 0
    for i, end in _pieces(sql, head.end()):
        if end - i > 1:
            continue  # quoted or a comment
        ch = sql[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif (depth == 0 and ch in "fF" and sql[i:i + 3].upper() == "FOR" and not _word_char(sql, i - 1)
              and not _word_char(sql, i + 3)):
            return sql[i + 3:].lstrip()
    return sql  # no FOR: not a statement MariaDB would have run


def _word_char(sql: str, i: int) -> bool:
    return 0 <= i < len(sql) and (sql[i].isalnum() or sql[i] in "_$")
