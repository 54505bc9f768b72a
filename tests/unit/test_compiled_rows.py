"""The compiled row decoder against the pure one, without a server: on
random bytes shaped like row images (and on plain garbage) both give the
same values of the same types, or fail with the same error."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from cynomys.core import compiled
from cynomys.parser import rows as R

pytestmark = pytest.mark.skipif(not compiled.available(), reason="cynomys._speedups is not built")


@dataclass
class Col:
    """The TABLE_MAP column attributes rows.py reads (pymysqlreplication's Column)."""

    type: int
    name: str = "c"
    unsigned: bool = False
    max_length: int = 0
    length_size: int = 0
    precision: int = 0
    decimals: int = 0
    fsp: int = 0
    bytes: int = 0
    bits: int = 0
    size: int = 1
    enum_values: list[str] = field(default_factory=list)
    set_values: list[str] = field(default_factory=list)
    collation_name: str = "utf8mb4_general_ci"


COLUMNS = [
    Col(R.TINY), Col(R.TINY, unsigned=True), Col(R.SHORT), Col(R.INT24), Col(R.INT24, unsigned=True), Col(R.LONG),
    Col(R.LONGLONG), Col(R.LONGLONG, unsigned=True), Col(R.FLOAT), Col(R.DOUBLE), Col(R.YEAR),
    Col(R.NEWDECIMAL, precision=15, decimals=2), Col(R.NEWDECIMAL, precision=65, decimals=30),
    Col(R.NEWDECIMAL, precision=9, decimals=9), Col(R.NEWDECIMAL, precision=20, decimals=0, unsigned=True),
    Col(R.VARCHAR, max_length=40), Col(R.VARCHAR, max_length=1200), Col(R.STRING, max_length=12),
    Col(R.STRING, max_length=4, collation_name="binary"), Col(R.VARCHAR, max_length=10, collation_name="binary"),
    Col(R.VARCHAR, max_length=10, collation_name="latin1_swedish_ci"), Col(R.BLOB, length_size=2),
    Col(R.BLOB, length_size=1, collation_name="binary"), Col(R.ENUM, enum_values=["a", "b", "c d"], size=1),
    Col(R.SET, set_values=["x", "y", "z"], size=1), Col(R.SET, set_values=[f"m{i}" for i in range(10)], size=2),
    Col(R.SET, set_values=[f"b{i}" for i in range(64)], size=8), Col(R.BIT, bytes=2, bits=13), Col(R.BIT, bytes=8, bits=64),
    Col(R.DATE), Col(R.DATETIME2, fsp=0), Col(R.DATETIME2, fsp=3), Col(R.DATETIME2, fsp=6), Col(R.TIMESTAMP2, fsp=0),
    Col(R.TIMESTAMP2, fsp=1), Col(R.TIMESTAMP2, fsp=6), Col(R.TIME2, fsp=0), Col(R.TIME2, fsp=2), Col(R.TIME2, fsp=4),
    Col(R.TIME2, fsp=6), Col(R.DATETIME), Col(R.TIMESTAMP), Col(R.TIME),
]


def _field(rng: random.Random, col: Col) -> bytes:
    """Random bytes of the right length for one value: mostly valid values,
    with zero dates, invalid UTF-8 and out-of-range DECIMAL digits now and then."""
    fixed = {R.TINY: 1, R.SHORT: 2, R.INT24: 3, R.LONG: 4, R.LONGLONG: 8, R.FLOAT: 4, R.DOUBLE: 8, R.YEAR: 1,
             R.DATE: 3, R.DATETIME: 8, R.TIMESTAMP: 4, R.TIME: 3, R.ENUM: col.size, R.SET: col.size, R.BIT: col.bytes}
    if col.type in fixed:
        return rng.randbytes(fixed[col.type])
    if col.type == R.NEWDECIMAL:
        intg, frac = col.precision - col.decimals, col.decimals
        size = intg // 9 * 4 + R._DIG2BYTES[intg % 9] + frac // 9 * 4 + R._DIG2BYTES[frac % 9]
        if rng.random() < 0.998:  # a valid value, positive or negative
            digits = [rng.randint(0, 9) for _ in range(col.precision)]
            raw = 0
            groups = ([intg % 9] if intg % 9 else []) + [9] * (intg // 9 + frac // 9) + ([frac % 9] if frac % 9 else [])
            it = iter(digits)
            for nd in groups:
                raw = (raw << (8 * R._DIG2BYTES[nd])) | int("".join(str(next(it)) for _ in range(nd)) or "0")
            raw |= 1 << (8 * size - 1)
            if rng.random() < 0.5:
                raw ^= (1 << (8 * size)) - 1
            return raw.to_bytes(size, "big")
        return rng.randbytes(size)
    if col.type in (R.DATETIME2, R.TIMESTAMP2, R.TIME2):
        base = {R.DATETIME2: 5, R.TIMESTAMP2: 4, R.TIME2: 3}[col.type]
        if rng.random() < 0.1:
            return bytes(base + R._FSP_BYTES[col.fsp])  # all zeros
        return rng.randbytes(base + R._FSP_BYTES[col.fsp])
    if col.type in (R.VARCHAR, R.STRING, R.BLOB):
        prefix = col.length_size if col.type == R.BLOB else (1 if col.max_length < 256 else 2)
        n = rng.randint(0, min(col.max_length or 300, 255 if prefix == 1 else 300))
        if col.collation_name == "binary" or col.type == R.BLOB and rng.random() < 0.02:
            body = rng.randbytes(n)  # (bytes invalid in a text column's charset, now and then)
        else:
            body = rng.choice(["é😀ab" * 80, "abcd" * 80, "xy" * 80, ""]).encode()[:n]
            body = body.decode("utf-8", "ignore").encode()
        return len(body).to_bytes(prefix, "little") + body
    raise AssertionError(col.type)


def _image(rng: random.Random, cols: list[Col]) -> bytes:
    nulls = [rng.random() < 0.2 for _ in cols]
    bitmap = sum(1 << i for i, isnull in enumerate(nulls) if isnull).to_bytes((len(cols) + 7) // 8, "little")
    return bitmap + b"".join(b"" if isnull else _field(rng, c) for c, isnull in zip(cols, nulls))


def test_generator_mostly_exercises_the_compiled_code() -> None:
    """Else the comparisons above would compare the pure path with itself."""
    ext = compiled._loaded
    assert ext is not None
    ran = 0
    for seed in range(40):
        rng = random.Random(seed)
        cols = rng.sample(COLUMNS, rng.randint(1, len(COLUMNS)))
        dec = R.TableDecoder.from_table_map(cols, [0])
        try:
            ext.decode_rows(b"".join(_image(rng, cols) for _ in range(5)), dec.compiled_plan, False)
            ran += 1
        except Exception:  # noqa: BLE001 - a fallback or the reference's error: counted as not run
            pass
    assert ran >= 25


def _outcome(dec: R.TableDecoder, body: bytes, pairs: bool, use: bool) -> Any:
    compiled.use_compiled(use)
    try:
        rows = dec.rows(body, (1 << len(dec.plan)) - 1, pairs)
    except Exception as exc:  # the same error on both paths is what is compared
        return ("error", type(exc).__name__, str(exc))
    return [tuple(None if img is None else tuple((type(v), v if v == v else "nan") for v in img) for img in pair)
            for pair in rows]


@pytest.fixture(autouse=True)
def _restore() -> Any:
    was = compiled.ext is not None
    yield
    compiled.use_compiled(was)


@pytest.mark.parametrize("seed", range(40))
def test_random_row_images_decode_alike(seed: int) -> None:
    rng = random.Random(seed)
    cols = rng.sample(COLUMNS, rng.randint(1, len(COLUMNS)))
    dec = R.TableDecoder.from_table_map(cols, [0])
    pairs = rng.random() < 0.3
    body = b"".join(_image(rng, cols) for _ in range(rng.randint(1, 30) * (2 if pairs else 1)))
    if rng.random() < 0.2:
        body = body[: rng.randint(0, len(body))]  # truncated event
    assert _outcome(dec, body, pairs, True) == _outcome(dec, body, pairs, False)


@pytest.mark.parametrize("seed", range(20))
def test_garbage_decodes_alike(seed: int) -> None:
    rng = random.Random(1000 + seed)
    cols = rng.sample(COLUMNS, rng.randint(1, 8))
    dec = R.TableDecoder.from_table_map(cols, [0])
    body = rng.randbytes(rng.randint(1, 400))
    assert _outcome(dec, body, False, True) == _outcome(dec, body, False, False)


def test_plan_covers_every_column_and_calls_back_only_where_needed() -> None:
    dec = R.TableDecoder.from_table_map(COLUMNS, [0])
    assert dec.compiled_plan is not None and len(dec.plan) == len(COLUMNS)
    called_back = {c.type for c, p in zip(COLUMNS, dec.plan) if p[0] == R.K_PY}
    assert called_back == {R.DATETIME, R.TIMESTAMP, R.TIME}  # the old temporal types: rare, decoded in Python


def test_columns_past_the_cache_budget_decode_alike() -> None:
    """Value caches have one memory budget per process (64 MiB); columns
    past it decode without a cache, with the same result."""
    rng = random.Random(7)
    cols = [Col(R.DATE)] * 2500  # 2500 x 32 KiB of date caches is past the budget
    dec = R.TableDecoder.from_table_map(cols, [0])
    body = b"".join(_image(rng, cols) for _ in range(3))
    assert _outcome(dec, body, False, True) == _outcome(dec, body, False, False)


def _mariadb_compressed(value: bytes, raw: bool = True, threshold: int = 100) -> bytes:
    """MariaDB's column compression record of ``value`` (sql/field.cc compress_zlib)."""
    import zlib

    if not value:
        return b""
    if len(value) < threshold:
        return b"\x00" + value
    width = (len(value).bit_length() + 7) // 8
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS if raw else zlib.MAX_WBITS)
    return bytes([0x80 | (8 if raw else 0) | width]) + len(value).to_bytes(width, "big") + packer.compress(value) \
        + packer.flush()


def test_compressed_columns_inflate_alike_on_both_paths() -> None:
    # MariaDB COMPRESSED columns, handed over as VARCHAR/BLOB (parser/tablemap.py):
    # stored as they are, raw deflate, zlib-wrapped; text and bytes; empty; NULL.
    cols = [Col(R.LONG), Col(R.VARCHAR, max_length=81, name="c"), Col(R.BLOB, length_size=2, name="w"),
            Col(R.VARCHAR, max_length=1200, name="v", collation_name="latin1_swedish_ci"),
            Col(R.BLOB, length_size=3, name="b", collation_name="binary")]
    for c in cols[1:]:
        c.compressed = True  # type: ignore[attr-defined]
    dec = R.TableDecoder.from_table_map(cols, [0])
    assert [p[0] for p in dec.plan[1:]] == [R.K_PY] * 4
    want = [(1, "x", "y" * 500, "ä" * 150, b"\x00\xff" * 300), (2, "", "", "", b""),
            (3, "żółw🐢", "żółw🐢 " * 40, "short", bytes(range(256)) * 8)]

    def image(row: tuple[Any, ...], raw: bool) -> bytes:
        out = b"\x00" + row[0].to_bytes(4, "little", signed=True)
        for c, v in zip(cols[1:], row[1:]):
            data = _mariadb_compressed(v if isinstance(v, bytes) else v.encode(
                "latin-1" if "latin1" in c.collation_name else "utf-8"), raw)
            out += len(data).to_bytes(1 if c.type == R.VARCHAR and c.max_length < 256 else
                                      2 if c.type == R.VARCHAR else c.length_size, "little") + data
        return out

    body = b"".join(image(r, raw) for r in want for raw in (True, False))
    for use in (True, False):
        got = _outcome(dec, body, False, use)
        assert got == [(tuple((type(v), v) for v in r), None) for r in want for _ in (0, 1)]
    # A damaged stream: the same one-line error on both paths, naming the column.
    bad = image(want[0], True)
    bad = bad[:-3] + b"\x00\x00\x00"
    errors = {_outcome(dec, bad, False, use) for use in (True, False)}
    assert len(errors) == 1 and "compressed column" in str(errors)
