"""The compiled snapshot-driver converters (``_speedups.TextConverter``)
give exactly the values of the Python converters they wrap, and hand out one
object for equal texts."""
from __future__ import annotations

import datetime as dt
import decimal
import random

import pytest

from cynomys.core import compiled
from cynomys.core.model import RawTemporal
from cynomys.snapshot.source import _temporal

pytestmark = pytest.mark.skipif(not compiled.available(), reason="cynomys._speedups is not built")

DATE_REF = _temporal(dt.date.fromisoformat)
DATETIME_REF = _temporal(dt.datetime.fromisoformat)

DATES = ["2020-01-02", "1970-01-01", "0001-01-01", "9999-12-31", "2020-02-29", "2021-02-29", "0000-00-00",
         "2020-00-15", "2020-13-01", "20200102", "2020-1-02", " 2020-01-02", "2020-01-02 ", "2020-01-0x", "",
         "2020-01-02T00:00:00", "+2020-01-02"]
DATETIMES = ["2020-01-02 03:04:05", "2020-01-02 03:04:05.5", "2020-01-02 03:04:05.12", "2020-01-02 03:04:05.123",
             "2020-01-02 03:04:05.1234", "2020-01-02 03:04:05.12345", "2020-01-02 03:04:05.123456",
             "2020-01-02 03:04:05.1234567", "2020-01-02 03:04:05.", "2020-01-02T03:04:05", "2020-01-02 24:00:00",
             "2020-01-02 23:60:00", "2020-01-02 23:59:60", "2020-01-02 03:04", "0000-00-00 00:00:00",
             "0000-00-00 00:00:00.000000", "2020-02-30 00:00:00", "9999-12-31 23:59:59.999999",
             "0001-01-01 00:00:00", "2020-01-02 03:04:05+00:00", "2020-01-02 03:04:05.12x"]
DECIMALS = ["0", "-0", "0.00", "-0.50", "12345.67", "-12345.67", "1E+3", "99999999999999999999999999.999999",
            "123456789012345678901234567890123456789012345678901234567890.5", "NaN", "1.2.3"]


def _compiled(kind: int, reference: object) -> object:
    ext = compiled._loaded
    assert ext is not None
    return ext.TextConverter(kind, reference)


def _same(got: object, want: object) -> bool:
    return type(got) is type(want) and (got == want or (isinstance(want, decimal.Decimal) and want.is_nan()
                                                         and got.is_nan())) and str(got) == str(want)


def _outcome(f: object, text: object) -> tuple[str, object]:
    try:
        return "value", f(text)  # type: ignore[operator]
    except Exception as exc:
        return "error", type(exc)


@pytest.mark.parametrize("kind, reference, texts", [
    (1, DATE_REF, DATES), (2, DATETIME_REF, DATETIMES), (0, decimal.Decimal, DECIMALS)])
def test_the_same_values_as_the_python_converters(kind: int, reference: object, texts: list[str]) -> None:
    conv = _compiled(kind, reference)
    for text in texts + [t.encode() for t in texts if t.isascii()] + ["2020-01-0\u00e9"]:
        for _ in range(2):  # the second time from the cache
            want, got = _outcome(reference, text), _outcome(conv, text)
            assert want[0] == got[0], text
            if want[0] == "value":
                assert _same(got[1], want[1]), (text, got, want)
            else:
                assert got[1] is want[1], text


def test_random_server_texts_and_one_object_per_text() -> None:
    rng = random.Random(7)
    date, stamp, dec = _compiled(1, DATE_REF), _compiled(2, DATETIME_REF), _compiled(0, decimal.Decimal)
    for _ in range(20000):
        d = dt.date.fromordinal(rng.randint(1, dt.date.max.toordinal()))
        fsp = rng.randint(0, 6)
        t = dt.datetime.combine(d, dt.time(rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59),
                                           rng.randint(0, 999999)))
        stext = t.strftime("%Y-%m-%d %H:%M:%S") + (f".{t.microsecond:06d}"[:fsp + 1] if fsp else "")
        ntext = f"{rng.choice(['', '-'])}{rng.randint(0, 10**rng.randint(1, 20))}.{rng.randint(0, 99):02d}"
        for conv, ref, text in ((date, DATE_REF, d.isoformat()), (stamp, DATETIME_REF, stext),
                                (dec, decimal.Decimal, ntext)):
            got = conv(text)  # type: ignore[operator]
            assert _same(got, ref(text)), text  # type: ignore[operator]
            if len(text) <= 24:
                assert conv(text) is got  # type: ignore[operator]
    # Zero dates come back as the model's RawTemporal, cached too.
    zero = date("0000-00-00")  # type: ignore[operator]
    assert type(zero) is RawTemporal and zero == "0000-00-00" and date("0000-00-00") is zero  # type: ignore[operator]


def test_mysqlclient_conversions_follow_the_selected_path() -> None:
    pytest.importorskip("MySQLdb")
    from MySQLdb.constants import FIELD_TYPE

    from cynomys.snapshot.source import _text_fields, mysqlclient_conversions

    types = (FIELD_TYPE.DATE, FIELD_TYPE.DATETIME, FIELD_TYPE.TIMESTAMP, FIELD_TYPE.NEWDECIMAL, FIELD_TYPE.DOUBLE)
    was = compiled.ext is not None
    try:
        compiled.use_compiled(True)
        fields = _text_fields(compiled.ext)
        conv = mysqlclient_conversions(fields)
        # Compiled: the driver hands these fields over as bytes (no converter), the cursor converts them.
        assert all(type(fields[t]).__name__ == "TextConverter" and conv[t] is None for t in types)
        compiled.use_compiled(False)
        fields = _text_fields(compiled.ext)
        conv = mysqlclient_conversions(fields)
        assert fields == {} and conv[FIELD_TYPE.NEWDECIMAL] is decimal.Decimal and conv[FIELD_TYPE.DOUBLE] is float
        assert conv[FIELD_TYPE.DATE]("0000-00-00") == RawTemporal("0000-00-00")
    finally:
        compiled.use_compiled(was)


DOUBLES = ["0", "-0", "1.5", "-1.5e-3", "1e308", "1e999", "-1e999", "4.9e-324", "1e-400", "123456789012345678901",
           "0.1", "3.141592653589793", "nan", "inf", "-inf", " 1", "1 ", "1_000", "", "0x10", "1e", "e1", "--1",
           "1.7976931348623157e308", "2.2250738585072014e-308", "1.0000000000000002"]


def test_doubles_the_same_as_float() -> None:
    conv = _compiled(3, float)
    for text in DOUBLES + [t.encode() for t in DOUBLES]:
        want, got = _outcome(float, text), _outcome(conv, text)
        assert want[0] == got[0], text
        if want[0] == "value":
            assert type(got[1]) is float and (got[1] == want[1] or (got[1] != got[1] and want[1] != want[1])), text
            assert repr(got[1]) == repr(want[1]), text
    ext = compiled._loaded
    assert ext is not None
    rng = random.Random(3)
    texts = [repr(rng.uniform(-1e6, 1e6)) for _ in range(2000)] + [repr(rng.random() * 10 ** rng.randint(-300, 300))
                                                                   for _ in range(2000)]
    plan = ((0, conv),)
    rows = ext.convert_fields([(t.encode(),) for t in texts], plan)
    assert [r[0] for r in rows] == [float(t) for t in texts]


def _reference_row(row: tuple[object, ...], plan: tuple[tuple[int, object], ...],
                   refs: dict[int, object]) -> tuple[object, ...]:
    out = list(row)
    for i, _ in plan:
        v = out[i]
        if isinstance(v, bytes):
            out[i] = refs[i](v.decode())  # type: ignore[operator]
        elif isinstance(v, str):
            out[i] = refs[i](v)  # type: ignore[operator]
    return tuple(out)


def test_convert_fields_gives_each_fields_reference_value() -> None:
    """A fetched block's fields converted in one pass: the values the
    converters give the driver's str one field at a time, NULLs kept, rows
    only the block holds changed in place, any other copied (its holder
    sees no change)."""
    ext = compiled._loaded
    assert ext is not None
    rng = random.Random(11)
    refs = {1: decimal.Decimal, 2: DATE_REF, 3: DATETIME_REF, 5: float}
    kinds = {1: 0, 2: 1, 3: 2, 5: 3}
    plan = tuple((i, _compiled(kinds[i], refs[i])) for i in sorted(refs))
    pools = {1: DECIMALS[:-2] + ["17.00", "0.04", "-12.5"], 2: [d for d in DATES if d[:1] != "+"],
             3: [d for d in DATETIMES if "+" not in d], 5: [d for d in DOUBLES if _outcome(float, d)[0] == "value"]}

    def value(i: int) -> object:
        if rng.random() < 0.1:
            return None
        text = rng.choice(pools[i])
        return text if rng.random() < 0.1 else text.encode()  # a str goes through the converter's call

    rows = [tuple([rng.randint(0, 9), value(1), value(2), value(3), "x", value(5)]) for _ in range(3000)]
    want = [_reference_row(r, plan, refs) for r in rows]
    shared = rows[7]  # held here too: must be copied, not changed
    snapshot = tuple(shared)
    got = ext.convert_fields(tuple(tuple(list(r)) if k != 7 else r for k, r in enumerate(rows)), plan)
    assert isinstance(got, list) and len(got) == len(want)
    for g, w in zip(got, want):
        assert len(g) == len(w)
        for a, b in zip(g, w):
            assert _same(a, b) or (a is None and b is None) or (type(a) is float and type(b) is float and a != a), \
                (g, w)
    assert shared == snapshot and got[7] is not shared
    # A field the reference refuses raises what it raises.
    with pytest.raises(decimal.InvalidOperation):
        ext.convert_fields([(0, b"1.2.3")], ((1, plan[0][1]),))
    with pytest.raises(IndexError):
        ext.convert_fields([(0,)], ((3, plan[0][1]),))
    with pytest.raises(TypeError):
        ext.convert_fields([(0, b"1")], ((1, decimal.Decimal),))
    with pytest.raises(TypeError):
        ext.convert_fields([[0, b"1"]], ((1, plan[0][1]),))
