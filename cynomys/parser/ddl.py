"""Parse one source DDL statement (MariaDB/MySQL) into neutral operations.

A target never runs the source's DDL text: it runs what this module says the
statement *does* to data a column store holds (tables, their columns and
their primary key), rendered by the target in its own dialect and types.
Everything else a statement may carry (indexes, foreign keys, defaults,
comments, engines, charsets, partitioning) changes nothing a replica of the
rows needs, so it becomes a ``NoOp`` that says why.

Column types are normalised to the text ``information_schema.COLUMN_TYPE``
uses (lower case, 'bigint unsigned', 'decimal(65,30)', "enum('a','b')"),
which is also what the binlog parser puts in ``ColumnDef.type``; display
widths and ZEROFILL are dropped (they change how a client shows a value,
not the value).

sqlglot does the parsing.  Where its MySQL dialect is wrong for the source
(type synonyms) a small subclass corrects it; where it cannot parse a
statement at all (it falls back to an opaque ``Command``) only a few
statements are recognised by hand (RENAME TABLE, ALTER DATABASE, CONVERT TO
CHARACTER SET); anything else raises ``UnsupportedDdl``, whose hint says how
to skip the statement on purpose.
"""
from __future__ import annotations

import decimal
import ipaddress
import logging
import re
import uuid
from typing import Any, Callable, Iterable, Iterator

import sqlglot
from sqlglot import Token, TokenType, exp
from sqlglot.dialects.mysql import MySQL
from sqlglot.errors import SqlglotError

from cynomys.core.dialect import MARIADB
from cynomys.core.model import ColumnDef, Value
from cynomys.core.sourcetypes import (
    BINARY_OF_SOURCE_TYPE,
    BINARY_OF_TEXT,
    BINARY_TYPES,
    INT_FAMILIES,
    members_text,
    smallest_lob,
    vector_type,
)
from cynomys.parser.ddl_ops import (
    ALL_OPS,
    SKIP_HINT,
    AddColumn,
    AddIndex,
    AddPrimaryKey,
    CreateDatabase,
    CreateTable,
    CreateTableLike,
    DdlOp,
    DropColumn,
    DropDatabase,
    DropPrimaryKey,
    DropTable,
    ModifyColumn,
    NoOp,
    RenameColumn,
    RenameTable,
    TableRef,
    Truncate,
    UnsupportedDdl,
    _shorten,
    implicit_fill,
)
from cynomys.parser.kinds import statement_of

log = logging.getLogger(__name__)

# The operations live in cynomys/parser/ddl_ops.py (no sqlglot there); they
# are names of this module too, as they always were.
__all__ = [
    "ALL_OPS", "SKIP_HINT", "AddColumn", "AddIndex", "AddPrimaryKey", "CreateDatabase", "CreateTable", "CreateTableLike",
    "DdlOp", "DropColumn", "DropDatabase", "DropPrimaryKey", "DropTable", "ModifyColumn", "NoOp",
    "RenameColumn", "RenameTable", "TableRef", "Truncate", "UnsupportedDdl", "implicit_fill", "parse_ddl",
]


# --------------------------------------------------------------------------
# The source dialect: sqlglot's MySQL with the type synonyms MariaDB means
# --------------------------------------------------------------------------
class CynomysSourceMySQL(MySQL):
    """sqlglot's MySQL reads REAL as FLOAT, INT8 as TINYINT and LONG as
    BIGINT; MariaDB/MySQL mean DOUBLE, BIGINT and MEDIUMTEXT."""

    class Tokenizer(MySQL.Tokenizer):
        KEYWORDS = {
            **MySQL.Tokenizer.KEYWORDS,
            "REAL": TokenType.DOUBLE,
            "INT1": TokenType.TINYINT,
            "INT2": TokenType.SMALLINT,
            "INT3": TokenType.MEDIUMINT,
            "INT4": TokenType.INT,
            "INT8": TokenType.BIGINT,
            "MIDDLEINT": TokenType.MEDIUMINT,
            "FLOAT4": TokenType.FLOAT,
            "FLOAT8": TokenType.DOUBLE,
            "LONG": TokenType.MEDIUMTEXT,
            "LONG VARCHAR": TokenType.MEDIUMTEXT,
            "LONG VARBINARY": TokenType.MEDIUMBLOB,
            # MariaDB's INET4 (10.10) and INET6 (10.5); UUID is sqlglot's own
            "INET4": TokenType.IPV4,
            "INET6": TokenType.IPV6,
        }


_DIALECT = CynomysSourceMySQL()


# --------------------------------------------------------------------------
# Column types: sqlglot DataType -> information_schema COLUMN_TYPE text
# --------------------------------------------------------------------------
T = exp.DType


def _params(dt: exp.DataType) -> list[int]:
    out: list[int] = []
    for p in dt.expressions:
        lit = p.this if isinstance(p, exp.DataTypeParam) else p
        if not isinstance(lit, exp.Literal) or lit.is_string:
            raise ValueError(f"type parameter {p.sql()} is not a number")
        out.append(int(lit.this))
    return out


def _members(dt: exp.DataType) -> str:
    values = []
    for e in dt.expressions:
        if not isinstance(e, exp.Literal) or not e.is_string:
            raise ValueError(f"ENUM/SET member {e.sql()} is not a string")
        values.append(e.this)
    return members_text(values)


def _sized(name: str, default: int | None = None) -> Callable[[exp.DataType], str]:
    def render(dt: exp.DataType) -> str:
        p = _params(dt)
        n = p[0] if p else default
        if n is None:
            raise ValueError(f"{name.upper()} needs a length")
        return f"{name}({n})"
    return render


def _fsp(name: str) -> Callable[[exp.DataType], str]:
    def render(dt: exp.DataType) -> str:
        p = _params(dt)
        return f"{name}({p[0]})" if p and p[0] else name
    return render


def _decimal(dt: exp.DataType) -> str:
    p = _params(dt)
    p += [10, 0][len(p):]  # DECIMAL = DECIMAL(10,0); DECIMAL(p) = DECIMAL(p,0)
    return f"decimal({p[0]},{p[1]})"


def _float(dt: exp.DataType) -> str:
    p = _params(dt)
    if len(p) == 1:  # FLOAT(p): a precision in bits picks single or double
        return "float" if p[0] <= 24 else "double"
    return f"float({p[0]},{p[1]})" if p else "float"


def _double(dt: exp.DataType) -> str:
    p = _params(dt)
    return f"double({p[0]},{p[1]})" if len(p) == 2 else "double"


def _lob(family: str) -> Callable[[exp.DataType], str]:
    # BLOB(n)/TEXT(n): the server picks the smallest type that holds n bytes
    # (n characters for TEXT; counted as 4 bytes each, as for utf8mb4).
    def render(dt: exp.DataType) -> str:
        p = _params(dt)
        if not p:
            return family
        return smallest_lob(family, p[0] * (4 if family == "text" else 1))
    return render


def _const(text: str) -> Callable[[exp.DataType], str]:
    return lambda dt: text


# sqlglot names its integer types as the catalog names the families
# (TINYINT .. BIGINT; UTINYINT .. UBIGINT for the UNSIGNED ones).
_INTS: dict[exp.DType, str] = {getattr(T, name.upper()): name for name in INT_FAMILIES}
_UINTS: dict[exp.DType, str] = {getattr(T, "U" + name.upper()): name for name in INT_FAMILIES}

#: sqlglot type -> renderer of the COLUMN_TYPE text (without ' unsigned').
TYPE_TEXT: dict[exp.DType, Callable[[exp.DataType], str]] = {
    **{t: _const(n) for t, n in _INTS.items()},
    **{t: _const(n) for t, n in _UINTS.items()},
    T.BOOLEAN: _const("tinyint"),
    T.DECIMAL: _decimal, T.UDECIMAL: _decimal,
    T.FLOAT: _float, T.DOUBLE: _double, T.UDOUBLE: _double,
    T.BIT: _sized("bit", 1),
    T.YEAR: _const("year"),
    T.DATE: _const("date"),
    T.DATETIME: _fsp("datetime"),
    T.TIMESTAMP: _fsp("timestamp"), T.TIMESTAMPTZ: _fsp("timestamp"),
    T.TIME: _fsp("time"),
    T.CHAR: _sized("char", 1), T.NCHAR: _sized("char", 1),
    T.VARCHAR: _sized("varchar"), T.NVARCHAR: _sized("varchar"),
    T.BINARY: _sized("binary", 1), T.VARBINARY: _sized("varbinary"),
    T.TINYTEXT: _const("tinytext"), T.TEXT: _lob("text"), T.MEDIUMTEXT: _const("mediumtext"),
    T.LONGTEXT: _const("longtext"),
    T.TINYBLOB: _const("tinyblob"), T.BLOB: _lob("blob"), T.MEDIUMBLOB: _const("mediumblob"),
    T.LONGBLOB: _const("longblob"),
    T.JSON: _const("json"),
    T.ENUM: lambda dt: f"enum({_members(dt)})",
    T.SET: lambda dt: f"set({_members(dt)})",
    T.GEOMETRY: _const("geometry"),
    T.SERIAL: _const("bigint"),
    # Types the binlog carries as their bytes (parser/rows.py), so the
    # replica holds them as those bytes too: MariaDB's INET4/INET6 in
    # network order and UUID (TABLE_MAP says BINARY(4)/BINARY(16)), MySQL
    # 9's VECTOR(n) as its n float32 values, little-endian.
    T.IPV4: _const(BINARY_OF_SOURCE_TYPE["inet4"]),
    T.IPV6: _const(BINARY_OF_SOURCE_TYPE["inet6"]),
    T.UUID: _const(BINARY_OF_SOURCE_TYPE["uuid"]),
    T.VECTOR: lambda dt: vector_type(_params(dt)[0] if _params(dt) else 0),
}
_UNSIGNED = frozenset(_UINTS) | {T.UDECIMAL, T.UDOUBLE, T.SERIAL}



def _column(node: exp.ColumnDef) -> tuple[ColumnDef, bool]:
    """A sqlglot column definition -> (ColumnDef, declared PRIMARY KEY)."""
    dt = node.args.get("kind")
    if not isinstance(dt, exp.DataType):
        raise ValueError(f"column {node.name!r} has no type")
    render = TYPE_TEXT.get(dt.this)
    if render is None:
        raise ValueError(f"column {node.name!r} has type {dt.sql(dialect=_DIALECT)}, which Cynomys cannot replicate")
    text = render(dt)
    unsigned = dt.this in _UNSIGNED
    nullable, primary = dt.this is not T.SERIAL, False
    for c in node.args.get("constraints") or []:
        kind = c.args.get("kind") if isinstance(c, exp.ColumnConstraint) else c
        if isinstance(kind, exp.NotNullColumnConstraint):
            nullable = bool(kind.args.get("allow_null"))
        elif isinstance(kind, exp.PrimaryKeyColumnConstraint):
            primary, nullable = True, False
        elif isinstance(kind, exp.ZeroFillColumnConstraint):
            unsigned = True  # ZEROFILL implies UNSIGNED
        elif isinstance(kind, exp.CharacterSetColumnConstraint) and kind.name.lower() == "binary":
            base, paren, rest = text.partition("(")
            text = BINARY_OF_TEXT.get(base, base) + paren + rest  # CHARACTER SET binary: the binary type
        # Everything else (DEFAULT, COMMENT, AUTO_INCREMENT, COLLATE, CHECK,
        # ON UPDATE, REFERENCES, generated-column expressions) does not change
        # what values the column holds on a replica: its rows come from the
        # source's row images, generated values included.
    if unsigned:
        text += " unsigned"
    return ColumnDef(node.name, text, nullable), primary




#: The text of INET4/INET6/UUID literals -> the bytes those columns hold.
_PACK: dict[exp.DType, Callable[[str], bytes]] = {
    T.IPV4: lambda s: ipaddress.IPv4Address(s).packed,
    T.IPV6: lambda s: ipaddress.IPv6Address(s).packed,
    T.UUID: lambda s: uuid.UUID(s).bytes,
}


def _fixed_width(col: ColumnDef) -> int:
    """BINARY(n)'s n (its values are always n bytes, zero-padded), else 0."""
    m = re.match(r"binary\((\d+)\)", col.type)
    return int(m.group(1)) if m and col.base_type == "binary" else 0


def _fill(node: exp.ColumnDef, col: ColumnDef) -> tuple[Value, bool]:
    """(value for existing rows, is CURRENT_TIMESTAMP) of an added column."""
    value, now = _fill_value(node, col)
    width = _fixed_width(col)
    if width and isinstance(value, bytes):
        value = value.ljust(width, b"\x00")
    return value, now




def _fill_value(node: exp.ColumnDef, col: ColumnDef) -> tuple[Value, bool]:
    default: exp.Expression | None = None
    for c in node.args.get("constraints") or []:
        kind = c.args.get("kind") if isinstance(c, exp.ColumnConstraint) else c
        if isinstance(kind, exp.ComputedColumnConstraint):
            raise ValueError(f"generated column {col.name!r}: the source computes values for existing rows "
                             "that Cynomys cannot reproduce; re-snapshot the table after this DDL")
        if isinstance(kind, exp.DefaultColumnConstraint):
            default = kind.this
    if default is None:
        return implicit_fill(col), False
    if isinstance(default, exp.Paren):
        default = default.this
    if isinstance(default, (exp.CurrentTimestamp, exp.CurrentDatetime)) or (
            isinstance(default, (exp.Anonymous, exp.Func, exp.Column))
            and default.name.upper() in ("NOW", "CURRENT_TIMESTAMP", "LOCALTIME", "LOCALTIMESTAMP")):
        return None, True
    if isinstance(default, exp.Null):
        return None, False
    negative = isinstance(default, exp.Neg)
    lit = default.this if negative else default
    if isinstance(lit, exp.Boolean):
        return int(bool(lit.this)), False
    if isinstance(lit, exp.BitString) and not negative:
        return int(str(lit.this) or "0", 2), False  # b'101': a BIT column's value is its integer
    if isinstance(lit, exp.HexString) and col.base_type == "bit" and not negative:
        return int(str(lit.this) or "0", 16), False
    if isinstance(lit, exp.HexString) and col.base_type in BINARY_TYPES and not negative:
        # X'0a0b': bytes that need not be text (cynomys/parser/ddl_render.py writes them so)
        return bytes.fromhex(str(lit.this)), False
    if isinstance(lit, exp.Literal):
        if lit.is_string:
            dt = node.args.get("kind")
            pack = _PACK.get(dt.this) if isinstance(dt, exp.DataType) else None
            if pack is not None:
                return pack(lit.this), False
            if col.base_type in BINARY_TYPES:
                return lit.this.encode(), False
            return lit.this, False
        text = ("-" if negative else "") + lit.this
        return (int(text) if re.fullmatch(r"-?\d+", text) else decimal.Decimal(text)), False
    raise ValueError(f"column {col.name!r} has DEFAULT {default.sql(dialect=_DIALECT)}: an expression whose "
                     "per-row values Cynomys cannot reproduce; re-snapshot the table after this DDL")


def column_def(type_sql: str, name: str = "c") -> ColumnDef:
    """Normalise a column definition's SQL text ('INT(11) ZEROFILL NOT NULL')
    the way DDL statements are normalised (for callers and tests)."""
    created = sqlglot.parse_one(f"CREATE TABLE t ({MARIADB.ident(name)} {type_sql})", dialect=_DIALECT)
    node = created.find(exp.ColumnDef)
    assert node is not None
    return _column(node)[0]


# --------------------------------------------------------------------------
# Statement -> operations
# --------------------------------------------------------------------------
def _ref(t: exp.Expression, default_database: str) -> TableRef:
    if not isinstance(t, exp.Table):
        raise ValueError(f"expected a table name, got {t.sql(dialect=_DIALECT)}")
    if not (t.db or default_database):
        raise ValueError(f"table {t.name!r} has no database and the statement ran with none selected")
    return (t.db or default_database, t.name)


def _names(items: Iterable[exp.Expression]) -> tuple[str, ...]:
    out = []
    for e in items:
        while isinstance(e, (exp.Ordered, exp.ColumnPrefix)):
            e = e.this
        out.append(e.name)
    return tuple(out)


def _primary_key(node: exp.Expression) -> exp.PrimaryKey | None:
    if isinstance(node, exp.PrimaryKey):
        return node
    if isinstance(node, (exp.Constraint, exp.AddConstraint)):
        for e in node.expressions:
            pk = _primary_key(e)
            if pk is not None:
                return pk
    return None


def _create(node: exp.Create, db: str) -> list[DdlOp]:
    kind = (node.args.get("kind") or "").upper()
    props = node.args.get("properties")
    prop_list = list(props.expressions) if isinstance(props, exp.Properties) else []
    if any(isinstance(p, exp.TemporaryProperty) for p in prop_list):
        return [NoOp("a temporary table lives in one source session; its rows are not replicated")]
    if kind in ("DATABASE", "SCHEMA"):
        target = node.this
        # sqlglot puts the name of CREATE SCHEMA x in the table's db slot.
        name = (target.name or target.db) if isinstance(target, exp.Table) else ""
        if not name:
            raise ValueError("CREATE DATABASE without a name")
        # OR REPLACE drops the database's tables on the source first.
        pre_db: list[DdlOp] = [DropDatabase(name, True)] if node.args.get("replace") else []
        return pre_db + [CreateDatabase(name, bool(node.args.get("exists")))]
    if kind == "INDEX":
        return _create_index(node.this, db)
    if kind == "VIEW":
        return [NoOp("a view holds no rows")]
    if kind != "TABLE":
        raise ValueError(f"CREATE {kind} is not replicated")
    if node.args.get("expression") is not None:
        raise ValueError("CREATE TABLE ... SELECT copies rows the target does not have; with binlog_format=ROW "
                         "the source logs a plain CREATE TABLE and the rows instead")
    schema = node.this
    table = schema.this if isinstance(schema, exp.Schema) else schema
    ref = _ref(table, db)
    exists = bool(node.args.get("exists"))
    pre: list[DdlOp] = [DropTable((ref,), if_exists=True)] if node.args.get("replace") else []
    likes = [p for p in prop_list if isinstance(p, exp.LikeProperty)]
    if isinstance(schema, exp.Schema):
        likes += [e for e in schema.expressions if isinstance(e, exp.LikeProperty)]
    if likes:
        like = _ref(likes[0].this, db)
        return pre + [CreateTableLike(ref[0], ref[1], like[0], like[1], exists)]
    if not isinstance(schema, exp.Schema):
        raise ValueError("CREATE TABLE without a column list")
    columns: list[ColumnDef] = []
    key: tuple[str, ...] = ()
    unique: list[tuple[str, ...]] = []
    plain: list[tuple[str, ...]] = []
    for e in schema.expressions:
        if isinstance(e, exp.ColumnDef):
            col, primary = _column(e)
            columns.append(col)
            if primary:
                key = (col.name,)
            elif any(isinstance(c.args.get("kind"), exp.UniqueColumnConstraint) for c in e.constraints):
                unique.append((col.name,))  # `c INT UNIQUE`
        else:
            pk = _primary_key(e)
            if pk is not None:
                key = _names(pk.expressions)
            elif (index := _whole_column_index(e)) is not None:
                (unique if isinstance(e, exp.UniqueColumnConstraint) else plain).append(index)
            # other table elements: FOREIGN KEY, CHECK, prefix/expression/FULLTEXT indexes
    if not columns:
        raise ValueError("CREATE TABLE without columns")
    lowered = {k.lower() for k in key}  # PRIMARY KEY columns are NOT NULL
    columns = [ColumnDef(c.name, c.type, False) if c.name.lower() in lowered else c for c in columns]
    indexes = () if key else tuple(dict.fromkeys(unique + plain))
    return pre + [CreateTable(ref[0], ref[1], tuple(columns), key, exists, indexes)]


def _create_index(node: exp.Expression, db: str) -> list[DdlOp]:
    """``CREATE [UNIQUE] INDEX i ON t (a, b)`` -> AddIndex on whole columns
    (a prefix or an expression part: nothing a target could build alike)."""
    params = node.args.get("params") if isinstance(node, exp.Index) else None
    table = node.args.get("table") if isinstance(node, exp.Index) else None
    parts = [p.this if isinstance(p, exp.Ordered) else p for p in (params.args.get("columns") or [] if params else [])]
    if not isinstance(table, exp.Table) or not parts or not all(isinstance(p, exp.Column) for p in parts):
        return [NoOp("an index changes no rows")]
    return [AddIndex(*_ref(table, db), tuple(p.name for p in parts))]


def _whole_column_index(node: exp.Expression) -> tuple[str, ...] | None:
    """A table element ``KEY [name] (a, b)`` / ``UNIQUE [KEY] [name] (a, b)``
    -> ('a', 'b'); None for anything else, and for an index a target could
    not build the same way: a prefix part, an expression, FULLTEXT/SPATIAL
    (as the snapshot's ``whole_column_indexes`` reads them)."""
    if isinstance(node, exp.IndexColumnConstraint) and not node.args.get("kind"):
        parts = node.expressions
    elif isinstance(node, exp.UniqueColumnConstraint) and isinstance(node.this, exp.Schema):
        parts = node.this.expressions
    else:
        return None
    if not parts or not all(isinstance(p, exp.Column) for p in parts):
        return None
    return tuple(p.name for p in parts)


def _drop(node: exp.Drop, db: str) -> list[DdlOp]:
    kind = (node.args.get("kind") or "").upper()
    exists = bool(node.args.get("exists"))
    tables = node.args.get("tables") or []
    if kind == "TABLE":
        if node.args.get("temporary"):
            return [NoOp("a temporary table lives in one source session")]
        return [DropTable(tuple(_ref(t, db) for t in tables), exists)]
    if kind in ("DATABASE", "SCHEMA"):  # sqlglot reads DROP SCHEMA x's name as a db
        return [DropDatabase(tables[0].name or tables[0].db, exists)]
    if kind == "INDEX":
        on = node.args.get("cluster")
        if tables and tables[0].name.upper() == "PRIMARY" and isinstance(on, exp.OnProperty):
            ref = _ref(on.this, db)
            return [DropPrimaryKey(*ref)]
        return [NoOp("an index changes no rows")]
    if kind == "VIEW":
        return [NoOp("a view holds no rows")]
    raise ValueError(f"DROP {kind} is not replicated")


def _alter_action(action: exp.Expression, ref: TableRef) -> list[DdlOp]:
    db, table = ref
    if isinstance(action, exp.ColumnDef):
        col, primary = _column(action)
        fill, now = _fill(action, col)
        ops: list[DdlOp] = [AddColumn(db, table, col, bool(action.args.get("exists")), fill, now)]
        return ops + ([AddPrimaryKey(db, table, (col.name,))] if primary else [])
    if isinstance(action, exp.Drop):
        kind = (action.args.get("kind") or "").upper()
        dropped = action.args.get("tables") or []
        if kind == "COLUMN":
            return [DropColumn(db, table, c.name, bool(action.args.get("exists"))) for c in dropped]
        if kind == "INDEX" and dropped and dropped[0].name.upper() == "PRIMARY":
            return [DropPrimaryKey(db, table)]
        if kind in ("INDEX", "KEY", "FOREIGN KEY", "CONSTRAINT", "CHECK"):
            return [NoOp(f"DROP {kind} changes no rows")]
        raise ValueError(f"ALTER TABLE ... DROP {kind} is not understood")
    if isinstance(action, exp.DropPrimaryKey):
        return [DropPrimaryKey(db, table)]
    if isinstance(action, exp.ModifyColumn):
        node = action.this
        assert isinstance(node, exp.ColumnDef)
        col, primary = _column(node)
        old = action.args.get("rename_from")
        ops = []
        if old is not None and old.name != col.name:  # CHANGE a b ... (a change of case is a rename too)
            ops.append(RenameColumn(db, table, old.name, col.name))
        ops.append(ModifyColumn(db, table, col))
        return ops + ([AddPrimaryKey(db, table, (col.name,))] if primary else [])
    if isinstance(action, exp.RenameColumn):
        return [RenameColumn(db, table, action.this.name, action.args["to"].name)]
    if isinstance(action, exp.AddConstraint):
        pk = _primary_key(action)
        if pk is not None:
            return [AddPrimaryKey(db, table, _names(pk.expressions))]
        indexes = [index for e in action.expressions if (index := _whole_column_index(e)) is not None]
        return [AddIndex(db, table, index) for index in indexes] or [NoOp("an index or constraint changes no rows")]
    if isinstance(action, exp.AlterColumn):
        if action.args.get("dtype") is not None:
            raise ValueError("ALTER COLUMN ... TYPE is not MariaDB syntax")
        return [NoOp("a column default or visibility changes no rows")]
    if isinstance(action, exp.AlterRename):
        return [RenameTable(((ref, _ref(action.this, db)),))]
    if isinstance(action, (exp.RenameIndex, exp.AlterIndex, exp.ForceProperty)):
        return [NoOp(f"{action.key} changes no rows")]
    raise ValueError(f"ALTER TABLE action {action.sql(dialect=_DIALECT)!r} is not understood")


def _alter(node: exp.Alter, db: str) -> list[DdlOp]:
    kind = (node.args.get("kind") or "").upper()
    if kind != "TABLE":
        if kind in ("DATABASE", "SCHEMA", "VIEW"):
            return [NoOp(f"ALTER {kind} changes no rows")]
        raise ValueError(f"ALTER {kind} is not replicated")
    ref = _ref(node.this, db)
    ops: list[DdlOp] = []
    for action in node.args.get("actions") or []:
        ops.extend(_alter_action(action, ref))
    # Table options (ENGINE, COMMENT, AUTO_INCREMENT, CHARSET, ALGORITHM,
    # LOCK, ROW_FORMAT, ORDER BY ...) change no column values.
    if node.args.get("options"):
        ops.append(NoOp("table options change no rows"))
    return ops or [NoOp("ALTER TABLE without a change to columns")]


def _truncate(node: exp.TruncateTable, db: str) -> list[DdlOp]:
    if node.args.get("is_database"):
        raise ValueError("TRUNCATE DATABASE is not MariaDB syntax")
    return [Truncate(*_ref(t, db)) for t in node.expressions]


#: Statement node type -> translator.
_HANDLERS: dict[type, Callable[[Any, str], list[DdlOp]]] = {
    exp.Create: _create,
    exp.Drop: _drop,
    exp.Alter: _alter,
    exp.TruncateTable: _truncate,
}


# --------------------------------------------------------------------------
# What sqlglot cannot parse: a few statements recognised from their tokens
# --------------------------------------------------------------------------
def _tokens(sql: str) -> list[Token]:
    return list(_DIALECT.tokenize(sql))


def _read_name(tokens: list[Token], i: int, db: str) -> tuple[TableRef, int]:
    """[db.]table starting at tokens[i] -> (ref, index after it)."""
    if i >= len(tokens):
        raise ValueError("a table name is missing")
    first = tokens[i].text
    if i + 2 < len(tokens) and tokens[i + 1].token_type is TokenType.DOT:
        return (first, tokens[i + 2].text), i + 3
    return (db, first), i + 1


def _rename_table(rest: str, db: str) -> list[DdlOp]:
    """'TABLE[S] [IF EXISTS] a [WAIT n | NOWAIT] TO b [, c TO d ...]' (MariaDB's
    form; WAIT/NOWAIT follows the first name)."""
    toks = _tokens(rest)
    words = _words(toks) + [""]  # a table named `wait` is not the keyword; one past the end
    if words[0] not in ("TABLE", "TABLES"):
        raise ValueError("only RENAME TABLE is replicated")
    i = 1
    if words[i:i + 2] == ["IF", "EXISTS"]:
        i += 2
    pairs = []
    while True:
        old, i = _read_name(toks, i, db)
        i += {"NOWAIT": 1, "WAIT": 2}.get(words[i], 0)
        if words[i] != "TO":
            raise ValueError("expected TO in RENAME TABLE")
        new, i = _read_name(toks, i + 1, db)
        pairs.append((old, new))
        if i >= len(toks):
            break
        if toks[i].token_type is not TokenType.COMMA:
            raise ValueError(f"unexpected {toks[i].text!r} in RENAME TABLE")
        i += 1
    return [RenameTable(tuple(pairs))]


_CONVERT = re.compile(r"^TABLE\s+\S+\s+CONVERT\s+TO\s+(?:CHARACTER\s+SET|CHARSET)\s+`?(\w+)`?"
                      r"(?:\s+COLLATE\s+`?\w+`?)?\s*$", re.IGNORECASE)


def _command(node: exp.Command, db: str) -> list[DdlOp]:
    word = str(node.this).upper()
    rest = node.expression.this if isinstance(node.expression, exp.Literal) else str(node.expression or "")
    if word == "ALTER" and re.match(r"^\s*(DATABASE|SCHEMA)\b", rest, re.IGNORECASE):
        return [NoOp("ALTER DATABASE changes defaults only")]
    if word == "CREATE" and re.match(r"^\s*(FULLTEXT|SPATIAL|VECTOR)\s+(INDEX|KEY)\b", rest, re.IGNORECASE):
        return [NoOp("an index changes no rows")]  # and no target builds these alike
    tablespace = re.match(r"^\s*TABLE\s+\S+\s+(DISCARD|IMPORT)\s+TABLESPACE\s*$", rest, re.IGNORECASE)
    if word == "ALTER" and tablespace:
        raise ValueError(f"{tablespace.group(1).upper()} TABLESPACE removes or brings the table's rows without "
                         "logging them, so the target would not follow (skip it, then re-snapshot the table)")
    if word == "ALTER" and re.match(r"^\s*TABLE\s+\S+\s+(DISABLE|ENABLE)\s+KEYS\s*$", rest, re.IGNORECASE):
        return [NoOp("DISABLE/ENABLE KEYS changes no rows")]
    m = _CONVERT.match(rest.strip()) if word == "ALTER" else None
    if m and m.group(1).lower() != "binary":
        # The target keeps its own character set (utf8mb4 holds any text).
        return [NoOp("a character set conversion keeps every value")]
    raise ValueError("sqlglot cannot parse this statement (unsupported syntax)")


# --------------------------------------------------------------------------
# Rewrites before parsing
# --------------------------------------------------------------------------
_RENAME = re.compile(r"^\s*(?:/\*.*?\*/\s*)*RENAME\s+(?=TABLES?\b)", re.IGNORECASE | re.DOTALL)
#: DROP TABLES: MariaDB's and MySQL's synonym of DROP TABLE, which sqlglot reads.
_DROP_TABLES = re.compile(r"^(\s*(?:/\*.*?\*/\s*)*DROP\s+(?:TEMPORARY\s+)?TABLE)S\b", re.IGNORECASE | re.DOTALL)
_ALTER_MODIFIERS = re.compile(r"^(\s*(?:/\*.*?\*/\s*)*ALTER)\s+(?:(?:ONLINE|IGNORE)\s+)+(?=TABLE\b)",
                              re.IGNORECASE | re.DOTALL)
#: ALTER TABLE partition clauses: those that drop or move rows without row
#: events make the replica wrong; the rest only reorganise storage.
_PARTITION_DATA_LOSS = frozenset({"DROP", "TRUNCATE", "EXCHANGE", "CONVERT", "DISCARD", "IMPORT"})
_PARTITION_STORAGE = frozenset({"ADD", "REORGANIZE", "COALESCE", "REBUILD", "OPTIMIZE", "ANALYZE", "CHECK",
                                "REPAIR", "REMOVE"})


def _rewrite_alter(sql: str) -> str:
    """Spell three ALTER TABLE forms sqlglot cannot parse the way it can:
    'ADD [COLUMN] (a INT, b INT)' -> 'ADD COLUMN a INT, ADD COLUMN b INT',
    'RENAME AS t2' -> 'RENAME TO t2' and 'ADD CHECK (..)' -> 'ADD
    CONSTRAINT CHECK (..)'.  Only keywords count: a quoted name or a string
    (`` CHANGE `rename` `as` INT ``) is never one."""
    toks = _tokens(sql)
    words = _words(toks) + [""]  # one past the end: no keyword follows the last token
    edits: list[tuple[int, int, str]] = []  # (start, end exclusive, replacement)
    depth, i = 0, 0
    while i < len(toks):
        t, up = toks[i], words[i]
        if t.token_type is TokenType.L_PAREN:
            depth += 1
        elif t.token_type is TokenType.R_PAREN:
            depth -= 1
        elif depth == 0 and up == "RENAME" and words[i + 1] == "AS":
            edits.append((toks[i + 1].start, toks[i + 1].end + 1, "TO"))
        elif depth == 0 and up == "ADD" and words[i + 1] == "CHECK":
            edits.append((toks[i + 1].start, toks[i + 1].start, "CONSTRAINT "))  # sqlglot reads it named or not
        elif depth == 0 and up == "ADD":
            j = i + 2 if words[i + 1] == "COLUMN" else i + 1
            if j < len(toks) and toks[j].token_type is TokenType.L_PAREN:
                level, pieces, start = 0, [], toks[j].end + 1
                for k in range(j, len(toks)):
                    kind = toks[k].token_type
                    level += kind is TokenType.L_PAREN
                    level -= kind is TokenType.R_PAREN
                    if level == 1 and kind is TokenType.COMMA or level == 0:
                        pieces.append(sql[start:toks[k].start].strip())
                        start = toks[k].end + 1
                    if level == 0:
                        break
                edits.append((t.start, toks[k].end + 1, ", ".join("ADD COLUMN " + p for p in pieces)))
                i = k + 1
                continue
        i += 1
    return _apply(sql, edits)


#: Tokens that are never a keyword: a quoted name, a string.
_NOT_WORDS = frozenset({TokenType.IDENTIFIER, TokenType.STRING, TokenType.NATIONAL_STRING, TokenType.HEX_STRING,
                        TokenType.BIT_STRING, TokenType.BYTE_STRING, TokenType.RAW_STRING})


def _words(toks: list[Token]) -> list[str]:
    """Each token's upper-cased text where it may be a keyword, else ''."""
    return [t.text.upper() if t.token_type not in _NOT_WORDS else "" for t in toks]


_INDEX_STATEMENT = re.compile(r"^\s*(?:/\*.*?\*/\s*)*(CREATE\s+(?:OR\s+REPLACE\s+)?(?:UNIQUE\s+|FULLTEXT\s+|SPATIAL\s+)?"
                              r"INDEX|DROP\s+INDEX)\b", re.IGNORECASE | re.DOTALL)
_INDEX_TYPES = frozenset({"BTREE", "HASH", "RTREE"})
_INDEX_WORDS = frozenset({"INDEX", "KEY"})


def _rewrite_index_options(sql: str) -> str:
    """Index options sqlglot cannot parse, which change no rows, left out of
    a CREATE/ALTER TABLE or CREATE/DROP INDEX (each stopped the applier as
    unparsable): ``USING BTREE|HASH|RTREE`` wherever it stands, MariaDB's
    ``IGNORED``/``NOT IGNORED`` after a column list (``ALTER INDEX i
    IGNORED`` becomes ``INVISIBLE``, which sqlglot reads), ``IF NOT EXISTS``
    after ``ADD [UNIQUE] INDEX|KEY`` (the target's index is made only if
    missing anyway), and everything after a CREATE INDEX's column list or a
    DROP INDEX's table (``ALGORITHM=``, ``LOCK=``, ``WAIT n``, ``COMMENT``,
    ``KEY_BLOCK_SIZE``...)."""
    toks = _tokens(sql)
    words = _words(toks)
    statement = _INDEX_STATEMENT.match(sql)
    edits: list[tuple[int, int, str]] = []  # (start, end exclusive, replacement)
    depth, i = 0, 0
    while i < len(toks):
        t, up = toks[i], words[i]
        if t.token_type is TokenType.L_PAREN:
            depth += 1
        elif t.token_type is TokenType.R_PAREN:
            depth -= 1
            if statement and depth == 0 and statement.group(1).upper().startswith("CREATE"):
                return _apply(sql[:t.end + 1], edits)  # the column list ends the statement's meaning
        elif up == "USING" and i + 1 < len(toks) and words[i + 1] in _INDEX_TYPES:
            edits.append((t.start, toks[i + 1].end + 1, ""))
            i += 2
            continue
        elif up == "IGNORED" or (up == "NOT" and i + 1 < len(words) and words[i + 1] == "IGNORED"):
            n = 1 if up == "IGNORED" else 2
            after_index = i >= 3 and words[i - 3] == "ALTER" and words[i - 2] in _INDEX_WORDS
            if after_index or (i and toks[i - 1].token_type is TokenType.R_PAREN):
                edits.append((t.start, toks[i + n - 1].end + 1,
                              ("INVISIBLE" if n == 1 else "VISIBLE") if after_index else ""))
                i += n
                continue
        elif up == "IF" and words[i + 1:i + 3] == ["NOT", "EXISTS"] and i >= 2 and words[i - 1] in _INDEX_WORDS \
                and "ADD" in words[max(0, i - 3):i - 1]:
            edits.append((t.start, toks[i + 2].end + 1, ""))
            i += 3
            continue
        elif statement and depth == 0 and up == "ON" and statement.group(1).upper().startswith("DROP"):
            _, end = _read_name(toks, i + 1, "")
            return _apply(sql[:toks[end - 1].end + 1], edits)  # ALGORITHM=, LOCK=, WAIT after the table
        i += 1
    return _apply(sql, edits)


#: MySQL/MariaDB spatial types sqlglot reads only as GEOMETRY; a TABLE_MAP
#: says GEOMETRY for each of them too (parser/rows.py), so the schema agrees.
_SPATIAL_SUBTYPES = frozenset({"POINT", "LINESTRING", "POLYGON", "MULTIPOINT", "MULTILINESTRING", "MULTIPOLYGON",
                               "GEOMETRYCOLLECTION"})
_NOT_BEFORE_COMPRESSED = frozenset({"=", "ROW_FORMAT", "COLUMN", "ADD", "MODIFY", "CHANGE"})
_COLUMN_STARTS = frozenset({"(", ",", "COLUMN", "ADD", "MODIFY", "CHANGE"})
_AFTER_TYPE = frozenset({",", ")", "", "NOT", "NULL", "DEFAULT", "COMMENT", "SRID", "REF_SYSTEM_ID", "AFTER", "FIRST",
                         "INVISIBLE", "VISIBLE", "PRIMARY", "UNIQUE", "KEY", "CHECK", "CONSTRAINT", "COLLATE"})


def _rewrite_storage_words(sql: str) -> str:
    """Words of CREATE/ALTER/DROP TABLE and TRUNCATE that change no rows and
    that sqlglot cannot parse (each stopped the applier as unparsable): a key
    part's ``ASC``/``DESC`` (descending indexes, MariaDB 10.8+, MySQL 8),
    MariaDB's column ``COMPRESSED[=zlib]``, ``DATA|INDEX DIRECTORY = '...'``,
    ``WAIT n``/``NOWAIT`` after the table (MariaDB), a spatial column's
    ``SRID n`` (MySQL 8), ``NATIONAL`` before a text type, ``IF EXISTS``
    after ``CHANGE|MODIFY [COLUMN]`` (MariaDB); a spatial subtype
    (``POINT``...) reads as GEOMETRY.
    A column named like one of them is left alone: each word is taken
    where only the keyword can stand."""
    toks = _tokens(sql)
    words = _words(toks)
    kinds = [t.token_type for t in toks]
    edits: list[tuple[int, int, str]] = []
    head = next((k for k in range(len(words)) if words[k] == "TABLE"), -1)  # the table's name follows
    if head >= 0 and words[head + 1:head + 3] == ["IF", "EXISTS"]:
        head += 2
    elif head >= 0 and words[head + 1:head + 4] == ["IF", "NOT", "EXISTS"]:
        head += 3
    after_name = _read_name(toks, head + 1, "")[1] if 0 <= head < len(toks) - 1 else -1
    depth, i = 0, 0
    while i < len(toks):
        t, up, nxt = toks[i], words[i], words[i + 1] if i + 1 < len(toks) else ""
        if kinds[i] is TokenType.L_PAREN:
            depth += 1
        elif kinds[i] is TokenType.R_PAREN:
            depth -= 1
        elif up in ("ASC", "DESC") and depth >= 1 and nxt in (",", ")"):
            edits.append((t.start, t.end + 1, ""))
        elif up == "COMPRESSED" and (nxt in _AFTER_TYPE or nxt == "=") and i \
                and words[i - 1] not in _NOT_BEFORE_COMPRESSED and toks[i - 1].text not in ("(", ","):
            # A column's attribute (after its type, charset, NOT NULL...), not
            # a column named so (a type follows it) nor ROW_FORMAT=COMPRESSED.
            end = toks[i + 2].end + 1 if nxt == "=" and i + 2 < len(toks) else t.end + 1
            edits.append((t.start, end, ""))
        elif up in ("DATA", "INDEX") and nxt == "DIRECTORY" and depth == 0:
            j = i + 2 + (words[i + 2:i + 3] == ["="])
            if j < len(toks) and kinds[j] is TokenType.STRING:
                edits.append((t.start, toks[j].end + 1, ""))
                i = j + 1
                continue
        elif depth == 0 and _is_wait(words, kinds, i) and (
                i == after_name or (words[0] in ("DROP", "TRUNCATE") and i + (up == "WAIT") + 1 == len(toks))):
            # ALTER TABLE t WAIT n ...; DROP TABLE a, b NOWAIT; TRUNCATE t WAIT n
            edits.append((t.start, toks[i + (up == "WAIT")].end + 1, ""))
        elif up == "SRID" and kinds[i + 1:i + 2] == [TokenType.NUMBER]:
            edits.append((t.start, toks[i + 1].end + 1, ""))
        elif up == "NATIONAL" and nxt.split(" ")[0] in ("CHAR", "VARCHAR", "CHARACTER"):  # CHARACTER VARYING: one token
            # NATIONAL VARCHAR(n): utf8 text, which any target's text holds.
            edits.append((t.start, t.end + 1, ""))
        elif depth == 0 and up == "IF" and nxt == "EXISTS" and i >= 2 and (
                words[i - 1] in ("CHANGE", "MODIFY") or words[i - 2:i] in (["CHANGE", "COLUMN"], ["MODIFY", "COLUMN"])):
            # CHANGE|MODIFY [COLUMN] IF EXISTS (MariaDB): the column is the
            # source's, so the target's mirror has it too (a column on
            # neither side stops the applier naming the statement).
            edits.append((t.start, toks[i + 1].end + 1, ""))
        elif up in _SPATIAL_SUBTYPES and i >= 2 and kinds[i - 1] in (TokenType.VAR, TokenType.IDENTIFIER) \
                and nxt in _AFTER_TYPE and (words[i - 2] in _COLUMN_STARTS or toks[i - 2].text in _COLUMN_STARTS
                                            or (i >= 3 and words[i - 3] in ("CHANGE", "COLUMN"))):
            # A type: after a column's name, before what may follow a type
            # (CHANGE a point INT names a column "point": INT follows it).
            edits.append((t.start, t.end + 1, "GEOMETRY"))
        i += 1
    return _apply(sql, edits)


def _is_wait(words: list[str], kinds: list[Any], i: int) -> bool:
    """``NOWAIT``, or ``WAIT`` and a number, at token ``i``."""
    return words[i] == "NOWAIT" or (words[i] == "WAIT" and kinds[i + 1:i + 2] == [TokenType.NUMBER])


def _apply(sql: str, edits: list[tuple[int, int, str]]) -> str:
    """``sql`` with ``edits`` (start, end exclusive, replacement; in order, not overlapping) made."""
    for start, end, text in reversed(edits):
        sql = sql[:start] + text + sql[end:]
    return sql


def _is_partition_clause(toks: list[Token], i: int) -> bool:
    # PARTITION is reserved, so unquoted it is always the keyword;
    # PARTITIONING is not, and only means it in REMOVE PARTITIONING.
    t = toks[i]
    if t.token_type is TokenType.IDENTIFIER:  # `quoted`
        return False
    word = " ".join(t.text.upper().split())
    if word == "PARTITIONING":
        return i > 0 and _words(toks[i - 1:i]) == ["REMOVE"]
    return word in ("PARTITION", "PARTITION BY")


def _strip_partitioning(sql: str) -> tuple[str, bool]:
    """Cut a top-level partitioning clause off a CREATE/ALTER TABLE.

    Returns (statement without it, whether one was cut).  Partitioning is
    storage layout: a replica's rows do not depend on it.  Raises for the
    partition operations that delete or move rows without logging them."""
    toks = _tokens(sql)
    depth = 0
    for i, t in enumerate(toks):
        if t.token_type is TokenType.L_PAREN:
            depth += 1
        elif t.token_type is TokenType.R_PAREN:
            depth -= 1
        elif depth == 0 and _is_partition_clause(toks, i):
            prev = _words(toks[i - 1:i])[0] if i else ""  # COMMENT 'drop' PARTITION BY: not DROP PARTITION
            if prev in _PARTITION_DATA_LOSS:
                raise ValueError(f"{prev} PARTITION removes or moves rows without logging them, so the target "
                                 "would keep them (skip it, then re-snapshot the table)")
            cut = toks[i - 1] if prev in _PARTITION_STORAGE else t
            head = sql[:cut.start].rstrip().rstrip(",")
            return head, True
    return sql, False


def parse_ddl(sql: str, default_database: str) -> list[DdlOp]:
    """One source DDL statement -> the operations it performs.

    Unqualified table names take ``default_database`` (the binlog event's
    current database).  Raises UnsupportedDdl when the statement cannot be
    parsed or translated."""
    try:
        return _parse(sql, default_database)
    except UnsupportedDdl:
        raise
    except (SqlglotError, ValueError, KeyError, IndexError, AttributeError, TypeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UnsupportedDdl(sql, reason) from exc


def _parse(sql: str, db: str) -> list[DdlOp]:
    sql = statement_of(sql)  # SET STATEMENT ... FOR <the DDL>
    rename = _RENAME.match(sql)
    if rename:  # sqlglot has no RENAME TABLE: read it from the tokens
        return _rename_table(sql[rename.end():], db)
    text = _DROP_TABLES.sub(r"\1", _ALTER_MODIFIERS.sub(r"\1 ", sql))
    partitioned = False
    if re.match(r"^\s*(?:/\*.*?\*/\s*)*(CREATE|ALTER)\b", text, re.IGNORECASE | re.DOTALL):
        text, partitioned = _strip_partitioning(text)
    if re.match(r"^\s*(?:/\*.*?\*/\s*)*ALTER\b", text, re.IGNORECASE | re.DOTALL):
        text = _rewrite_alter(text)
    if re.match(r"^\s*(?:/\*.*?\*/\s*)*(CREATE|ALTER|DROP\s+INDEX)\b", text, re.IGNORECASE | re.DOTALL):
        text = _rewrite_index_options(text)
    if re.match(r"^\s*(?:/\*.*?\*/\s*)*(CREATE|ALTER|DROP\s+TABLE|TRUNCATE)\b", text, re.IGNORECASE | re.DOTALL):
        text = _rewrite_storage_words(text)
    if re.match(r"^\s*(?:/\*.*?\*/\s*)*ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?[`\w.]+\s*$", text,
                re.IGNORECASE | re.DOTALL):
        return [NoOp("partitioning changes no rows")] if partitioned else [NoOp("ALTER TABLE without a change")]
    statements = [s for s in sqlglot.parse(text, dialect=_DIALECT) if s is not None]
    if not statements:
        raise ValueError("empty statement")
    ops: list[DdlOp] = []
    for node in statements:
        ops.extend(_translate(node, db))
    if partitioned:
        ops.append(NoOp("partitioning changes no rows"))
    log.debug("DDL %r -> %s", _shorten(sql, 120), ops)
    return ops


def _translate(node: exp.Expr, db: str) -> Iterator[DdlOp]:
    if isinstance(node, exp.Command):
        yield from _command(node, db)
        return
    handler = _HANDLERS.get(type(node))
    if handler is None:
        raise ValueError(f"not a DDL statement Cynomys replicates ({node.key})")
    yield from handler(node, db)
