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

    from cynomys.snapshot.source import mysqlclient_conversions

    was = compiled.ext is not None
    try:
        compiled.use_compiled(True)
        conv = mysqlclient_conversions()
        assert all(type(conv[t]).__name__ == "TextConverter"
                   for t in (FIELD_TYPE.DATE, FIELD_TYPE.DATETIME, FIELD_TYPE.TIMESTAMP, FIELD_TYPE.NEWDECIMAL))
        compiled.use_compiled(False)
        conv = mysqlclient_conversions()
        assert conv[FIELD_TYPE.NEWDECIMAL] is decimal.Decimal
        assert conv[FIELD_TYPE.DATE]("0000-00-00") == RawTemporal("0000-00-00")
    finally:
        compiled.use_compiled(was)
