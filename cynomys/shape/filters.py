"""Row filters: an SQL predicate, parsed with sqlglot, evaluated on row images.

``[shape.tables."<pattern>"] filter = "tenant_id = 42 AND status <> 'test'"``
keeps the rows for which the predicate is TRUE (SQL's three-valued logic:
a comparison with NULL is unknown, and unknown rows are left out, as a
WHERE clause does).  The producer evaluates it on both images of a change,
so a row moving in or out of the filter becomes an insert or a delete on
the target (cynomys/shape/stage.py).

What a predicate may hold: column names (the source's), literals (numbers,
'text', TRUE/FALSE, NULL), ``= <> != < <= > >=``, ``AND OR NOT``,
``IN (...)``, ``BETWEEN``, ``LIKE`` (``%``, ``_``), ``IS [NOT] NULL``,
``+ - * / %`` and parentheses.  Anything else is refused when the
configuration is checked.  Values compare as Cynomys holds them
(core/model.py), not in a column's collation: text compares case-sensitively;
a text literal compared with a number, a date or a time is read as one
('2024-01-31', '12.50'), and one that cannot be is unknown.
"""
from __future__ import annotations

import datetime
import decimal
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from cynomys.core.model import Row, Value

Get = Callable[[Row], Any]
Cond = Callable[[Row], "bool | None"]


@dataclass(frozen=True)
class RowFilter:
    """A parsed predicate; ``bind`` ties it to a table's column order."""

    text: str
    tree: exp.Expr
    columns: frozenset[str]  # lower-case names it reads

    def bind(self, names: Sequence[str]) -> Callable[[Row], bool]:
        """A function row -> kept, for rows of the columns ``names``
        (KeyError naming a column the table lacks)."""
        index = {n.lower(): i for i, n in enumerate(names)}
        missing = sorted(self.columns - index.keys())
        if missing:
            raise KeyError(", ".join(missing))
        cond = _cond(self.tree, index)
        return lambda row: cond(row) is True


def parse_filter(text: str) -> RowFilter:
    """Parse a predicate; ValueError saying what is wrong."""
    try:
        tree = sqlglot.parse_one(text, read="mysql")
    except SqlglotError as exc:
        raise ValueError(f"not an SQL predicate: {str(exc).splitlines()[0]}") from None
    if tree is None:
        raise ValueError("empty predicate")
    cols = frozenset(c.name.lower() for c in tree.find_all(exp.Column))
    _cond(tree, {c: 0 for c in cols})  # refuses what the evaluator does not know
    return RowFilter(text, tree, cols)


# -- values ---------------------------------------------------------------------------
def _literal(node: exp.Literal) -> Value:
    if node.is_string:
        return str(node.this)
    text = str(node.this)
    return int(text) if re.fullmatch(r"\d+", text) else decimal.Decimal(text)


_NUMBER = (int, float, decimal.Decimal)


def _as_number(v: str) -> decimal.Decimal | None:
    try:
        return decimal.Decimal(v.strip())
    except decimal.InvalidOperation:
        return None


def _as_datetime(v: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(v.strip())
    except ValueError:
        return None


def _naive(v: datetime.date) -> datetime.datetime:
    if isinstance(v, datetime.datetime):
        return v.astimezone(datetime.timezone.utc).replace(tzinfo=None) if v.tzinfo is not None else v
    return datetime.datetime(v.year, v.month, v.day)


def _pair(a: Any, b: Any) -> tuple[Any, Any] | None:
    """``a`` and ``b`` in one comparable domain, or None (unknown)."""
    if isinstance(a, _NUMBER) and isinstance(b, _NUMBER):
        return a, b
    if isinstance(a, str) and isinstance(b, str):
        return str(a), str(b)  # a zero date (RawTemporal) compares as its text
    if isinstance(a, str) and not isinstance(b, str):
        flipped = _pair(b, a)
        return None if flipped is None else (flipped[1], flipped[0])
    if isinstance(a, _NUMBER) and isinstance(b, str):
        n = _as_number(b)
        return None if n is None else (a, n)
    if isinstance(a, datetime.date) and isinstance(b, (str, datetime.date)):
        d = _as_datetime(b) if isinstance(b, str) else b
        return None if d is None else (_naive(a), _naive(d))
    if isinstance(a, datetime.timedelta) and isinstance(b, datetime.timedelta):
        return a, b
    if isinstance(a, bytes) and isinstance(b, (bytes, str)):
        return a, b.encode() if isinstance(b, str) else b
    return None


def _compare(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], "bool | None"]:
    def cmp(a: Any, b: Any) -> bool | None:
        if a is None or b is None:
            return None
        pair = _pair(a, b)
        if pair is None:
            return None
        try:
            return bool(op(*pair))
        except TypeError:
            return None
    return cmp


_COMPARE: dict[type[exp.Expr], Callable[[Any, Any], "bool | None"]] = {
    exp.EQ: _compare(operator.eq), exp.NEQ: _compare(operator.ne), exp.LT: _compare(operator.lt),
    exp.LTE: _compare(operator.le), exp.GT: _compare(operator.gt), exp.GTE: _compare(operator.ge),
}


def _arith(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def calc(a: Any, b: Any) -> Any:
        if a is None or b is None:
            return None
        if isinstance(a, str):
            a = _as_number(a)
        if isinstance(b, str):
            b = _as_number(b)
        if not isinstance(a, _NUMBER) or not isinstance(b, _NUMBER):
            return None
        if isinstance(a, float) or isinstance(b, float):
            a, b = float(a), float(b)
        else:
            a, b = decimal.Decimal(a), decimal.Decimal(b)
        try:
            return op(a, b)
        except (ZeroDivisionError, decimal.InvalidOperation, decimal.DivisionByZero):
            return None  # x / 0 is NULL in MySQL
    return calc


_ARITH: dict[type[exp.Expr], Callable[[Any, Any], Any]] = {
    exp.Add: _arith(operator.add), exp.Sub: _arith(operator.sub), exp.Mul: _arith(operator.mul),
    exp.Div: _arith(operator.truediv), exp.Mod: _arith(operator.mod),
}


def _value(node: exp.Expr, index: dict[str, int]) -> Get:
    """An expression giving a value."""
    if isinstance(node, exp.Paren):
        return _value(node.this, index)
    if isinstance(node, exp.Column):
        i = index[node.name.lower()]
        return lambda row: row[i]
    if isinstance(node, exp.Literal):
        v = _literal(node)
        return lambda row: v
    if isinstance(node, exp.Null):
        return lambda row: None
    if isinstance(node, exp.Boolean):
        b = 1 if node.this else 0
        return lambda row: b
    if isinstance(node, exp.Neg):
        inner = _value(node.this, index)
        return lambda row: _arith(operator.sub)(0, inner(row))
    fn = _ARITH.get(type(node))
    if fn is not None:
        left, right = _value(node.this, index), _value(node.expression, index)
        return lambda row: fn(left(row), right(row))
    # A condition used as a value (a = (b > 1)) is 1, 0 or NULL.
    cond = _cond(node, index)
    return lambda row: (lambda r: None if r is None else int(r))(cond(row))


def _like(pattern: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _cond(node: exp.Expr, index: dict[str, int]) -> Cond:
    """An expression giving TRUE, FALSE or unknown (None)."""
    if isinstance(node, exp.Paren):
        return _cond(node.this, index)
    if isinstance(node, (exp.And, exp.Or)):
        left, right = _cond(node.this, index), _cond(node.expression, index)
        join = _and if isinstance(node, exp.And) else _or
        return lambda row: join(left(row), right(row))
    if isinstance(node, exp.Not):
        inner = _cond(node.this, index)
        return lambda row: (lambda r: None if r is None else not r)(inner(row))
    cmp = _COMPARE.get(type(node))
    if cmp is not None:
        left, right = _value(node.this, index), _value(node.expression, index)
        return lambda row: cmp(left(row), right(row))
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        inner = _value(node.this, index)
        return lambda row: inner(row) is None
    if isinstance(node, exp.In) and not node.args.get("query") and node.expressions:
        probe = _value(node.this, index)
        options = [_value(e, index) for e in node.expressions]
        eq = _COMPARE[exp.EQ]

        def isin(row: Row) -> bool | None:
            v = probe(row)
            result: bool | None = False
            for o in options:
                r = eq(v, o(row))
                if r:
                    return True
                if r is None:
                    result = None
            return result
        return isin
    if isinstance(node, exp.Between):
        probe, low, high = _value(node.this, index), _value(node.args["low"], index), _value(node.args["high"], index)
        ge, le = _COMPARE[exp.GTE], _COMPARE[exp.LTE]
        return lambda row: (lambda v: _and(ge(v, low(row)), le(v, high(row))))(probe(row))
    if isinstance(node, exp.Like) and isinstance(node.expression, exp.Literal) and node.expression.is_string:
        probe, rx = _value(node.this, index), _like(str(node.expression.this))

        def like(row: Row) -> bool | None:
            v = probe(row)
            if v is None:
                return None
            text = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            return rx.fullmatch(text) is not None
        return like
    if isinstance(node, (exp.Column, exp.Literal, exp.Boolean, exp.Null, exp.Neg, *_ARITH)):
        value = _value(node, index)  # a bare value: true when non-zero (MySQL)

        def truthy(row: Row) -> bool | None:
            v = value(row)
            if v is None:
                return None
            if isinstance(v, str):
                n = _as_number(v)
                return bool(n) if n is not None else False
            return bool(v)
        return truthy
    raise ValueError(f"{node.sql(dialect='mysql')!r} is not supported in a row filter (comparisons, AND/OR/NOT, "
                     "IN, BETWEEN, LIKE, IS NULL and arithmetic are)")
