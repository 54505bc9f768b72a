/*
 * cynomys._speedups: the producer's compiled hot path (issue #12).
 *
 * Two functions, each the compiled twin of a pure-Python reference that
 * stays the specification and the fallback:
 *
 *   decode_rows(body, plan, pairs)   <-> parser/rows.py TableDecoder.rows
 *   encode_batch(...)                <-> schemas/codec.py encode (Avro bytes)
 *
 * (and later ones, each beside its twin: TextConverter and convert_fields
 * <-> the Python converters of snapshot/source.py, the LOAD DATA writers
 * <-> applier/targets/columnstore, column_values <-> core/columnar.py).
 *
 * Contract with the Python side: the results are identical (same values,
 * same types; same Avro bytes).  Whenever this code meets something it does
 * not handle exactly like the reference -- an invalid/zero date, bytes not
 * valid in a charset, a truncated event, an unexpected value type -- it
 * either calls the column's pure-Python decoder for that one value, or
 * raises Fallback so the caller redoes the whole call in Python (which then
 * produces the reference result or the reference error).  Nothing here
 * invents its own error semantics.
 *
 * Binary formats follow the server (sql-common/my_time.c, strings/decimal.c):
 * integers little-endian, temporal parts and DECIMAL big-endian.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>
#include <string.h>

static PyObject *Fallback;        /* raised to make the caller use the pure path */
static PyObject *DecimalType;     /* decimal.Decimal */
static PyObject *RawTemporalType; /* cynomys.core.model.RawTemporal */
static PyObject *S_comma;         /* ",": joins a SET's members */
static PyObject *S_f;             /* "f": format(Decimal, 'f') */

/* Column kinds of a decode plan; must match parser/rows.py _plan_for(). */
enum {
    K_PY = 0, K_INT = 1, K_FLOAT = 2, K_DOUBLE = 3, K_DECIMAL = 4, K_TEXT_UTF8 = 5,
    K_TEXT_CODEC = 6, K_BYTES = 7, K_BINARY_FIXED = 8, K_DATE = 9, K_DATETIME2 = 10,
    K_TIMESTAMP2 = 11, K_TIME2 = 12, K_YEAR = 13, K_BIT = 14, K_ENUM = 15, K_NULL = 16, K_SET = 17,
};

typedef struct {
    int kind;
    Py_ssize_t a, b;      /* kind parameters (size, unsigned, prefix, fsp, ...) */
    PyObject *obj;        /* codec name (K_TEXT_CODEC), enum table (K_ENUM), members (K_SET); borrowed */
    PyObject *pydec;      /* the pure decoder (buf, off) -> (value, off); borrowed */
    /* DECIMAL: byte size and the (bytes, digits) groups, most significant first */
    int dsize, ngroups;
    unsigned char gbytes[16], gdigits[16];
    const char *codec;
    void *cache;          /* VSlot[VCACHE] (DATE, DECIMAL) or SSlot[SCACHE] (short UTF-8 text) */
    size_t cache_size;    /* bytes of cache, 0 until first used */
    int cacheable;        /* a kind with a cache that may still get one */
    /* K_SET: the last value's bit mask and text (a table's rows repeat few
     * combinations of members; the text is immutable, so it is handed out again) */
    uint64_t set_mask;
    PyObject *set_text;   /* owned, or NULL */
} ColPlan;

/* Value caches of a compiled plan.  Dates, DECIMALs and short strings
 * repeat a lot in real tables (dates, prices, flags, codes) and their
 * Python objects are immutable, so one object per distinct raw field is
 * handed out again: fewer allocations, and the Avro writer's str(Decimal)
 * cache (by identity) hits.  Direct-mapped: a collision just replaces. */
#define VCACHE 2048
#define SCACHE 512
#define SCACHE_MAXLEN 24
typedef struct { uint64_t key; PyObject *v; } VSlot;
typedef struct { Py_ssize_t len; char raw[SCACHE_MAXLEN]; PyObject *v; } SSlot;

/* Caches are allocated on first use, within one budget for the process:
 * a producer that sees thousands of wide tables keeps bounded memory (the
 * columns past the budget decode without a cache, just as fast as before
 * caching). */
#define CACHE_BUDGET ((size_t)64 << 20)
static size_t cache_bytes;

static void *get_cache(ColPlan *c) {
    if (c->cache || !c->cacheable) return c->cache;
    size_t size = c->kind == K_TEXT_UTF8 ? SCACHE * sizeof(SSlot) : VCACHE * sizeof(VSlot);
    c->cacheable = 0;
    if (cache_bytes + size > CACHE_BUDGET || !(c->cache = PyMem_Calloc(1, size))) return NULL;
    cache_bytes += size;
    c->cache_size = size;
    return c->cache;
}

static inline VSlot *vslot(ColPlan *c, uint64_t key) {
    return &((VSlot *)c->cache)[(key * 0x9E3779B97F4A7C15ULL) >> (64 - 11)];
}

static inline SSlot *sslot(SSlot *cache, const char *s, Py_ssize_t len) {
    uint32_t h = 2166136261u;
    for (Py_ssize_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return &cache[h % SCACHE];
}

/* The slot's object for the text s (a new reference), or NULL. */
static inline PyObject *sslot_hit(SSlot *slot, const char *s, Py_ssize_t len) {
    if (!slot->v || slot->len != len || memcmp(slot->raw, s, (size_t)len) != 0) return NULL;
    Py_INCREF(slot->v);
    return slot->v;
}

/* Keep v (borrowed) as the slot's object for the text s. */
static inline void sslot_keep(SSlot *slot, const char *s, Py_ssize_t len, PyObject *v) {
    Py_INCREF(v);
    Py_XSETREF(slot->v, v);
    slot->len = len;
    memcpy(slot->raw, s, (size_t)len);
}

static const int DIG2BYTES[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};
static const int FSP_BYTES[7] = {0, 1, 1, 2, 2, 3, 3};
static const int FSP_SCALE[7] = {1, 10000, 10000, 100, 100, 1, 1};
static const uint32_t POW10[10] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000};

static inline uint64_t be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

static inline uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int days_in_month(int y, int m) {
    static const int d[13] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0)) return 29;
    return d[m];
}

static int valid_date(long y, long m, long d) {
    return y >= 1 && y <= 9999 && m >= 1 && m <= 12 && d >= 1 && d <= days_in_month((int)y, (int)m);
}

/* Howard Hinnant's days_from_civil / civil_from_days (proleptic Gregorian). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const unsigned yoe = (unsigned)(y - era * 400);
    const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

static void civil_from_days(int64_t z, int *y, int *m, int *d) {
    z += 719468;
    const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    const unsigned doe = (unsigned)(z - era * 146097);
    const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const int64_t yy = (int64_t)yoe + era * 400;
    const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const unsigned mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = (int)(yy + (*m <= 2));
}

/* ======================================================================
 * Row decoding
 * ==================================================================== */

static void free_plan(ColPlan *cols, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        ColPlan *c = &cols[i];
        Py_CLEAR(c->set_text);
        if (!c->cache) continue;
        if (c->kind == K_TEXT_UTF8)
            for (int k = 0; k < SCACHE; k++) Py_XDECREF(((SSlot *)c->cache)[k].v);
        else
            for (int k = 0; k < VCACHE; k++) Py_XDECREF(((VSlot *)c->cache)[k].v);
        PyMem_Free(c->cache);
        cache_bytes -= c->cache_size;
    }
    PyMem_Free(cols);
}

static int build_plan(PyObject *plan, ColPlan **out, Py_ssize_t *n_out) {
    if (!PyTuple_Check(plan)) {
        PyErr_SetString(PyExc_TypeError, "plan must be a tuple");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(plan);
    ColPlan *cols = PyMem_Calloc(n ? n : 1, sizeof(ColPlan));
    if (!cols) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *spec = PyTuple_GET_ITEM(plan, i);
        ColPlan *c = &cols[i];
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5) {
            PyErr_SetString(PyExc_TypeError, "plan entry must be (kind, a, b, obj, pydec)");
            goto fail;
        }
        c->kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
        c->a = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 1));
        c->b = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 2));
        if (PyErr_Occurred()) goto fail;
        c->obj = PyTuple_GET_ITEM(spec, 3);
        c->pydec = PyTuple_GET_ITEM(spec, 4);
        if (c->kind == K_TEXT_CODEC) {
            c->codec = PyUnicode_AsUTF8(c->obj);
            if (!c->codec) goto fail;
        }
        if ((c->kind == K_ENUM || c->kind == K_SET) && !PyList_Check(c->obj)) {
            PyErr_SetString(PyExc_TypeError, "enum table and set members must be a list");
            goto fail;
        }
        if (c->kind == K_SET && (c->a < 1 || c->a > 8)) c->kind = K_PY;
        if (c->kind == K_DECIMAL) {
            /* strings/decimal.c: groups of 9 digits in 4 bytes, leftover
             * digits of the integer part first, of the fraction last. */
            int precision = (int)c->a, scale = (int)c->b;
            int intg = precision - scale, intg0 = intg / 9, intg0x = intg % 9;
            int frac0 = scale / 9, frac0x = scale % 9, g = 0, size = 0;
            if (intg < 0 || intg0 + frac0 + 2 > 16) { c->kind = K_PY; continue; }
            if (intg0x) { c->gbytes[g] = DIG2BYTES[intg0x]; c->gdigits[g++] = intg0x; }
            for (int k = 0; k < intg0 + frac0; k++) { c->gbytes[g] = 4; c->gdigits[g++] = 9; }
            if (frac0x) { c->gbytes[g] = DIG2BYTES[frac0x]; c->gdigits[g++] = frac0x; }
            for (int k = 0; k < g; k++) size += c->gbytes[k];
            c->ngroups = g;
            c->dsize = size;
            if (size == 0) c->kind = K_PY;
        }
        if (c->kind < K_PY || c->kind > K_SET) {
            PyErr_SetString(PyExc_ValueError, "unknown column kind in plan");
            goto fail;
        }
        c->cacheable = c->kind == K_DATE || c->kind == K_TEXT_UTF8 || (c->kind == K_DECIMAL && c->dsize <= 8);
    }
    *out = cols;
    *n_out = n;
    return 0;
fail:
    free_plan(cols, n);
    return -1;
}

/* The pure decoder for one value: used for what this file does not
 * handle itself (JSON, SET, old temporal types, zero dates, bad bytes). */
static PyObject *call_pydec(ColPlan *c, PyObject *body, Py_ssize_t *off) {
    PyObject *r = PyObject_CallFunction(c->pydec, "On", body, *off);
    if (!r) return NULL;
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2) {
        Py_DECREF(r);
        PyErr_SetString(Fallback, "pure decoder returned something else than (value, off)");
        return NULL;
    }
    PyObject *v = PyTuple_GET_ITEM(r, 0);
    Py_ssize_t n = PyLong_AsSsize_t(PyTuple_GET_ITEM(r, 1));
    if (n == -1 && PyErr_Occurred()) { Py_DECREF(r); return NULL; }
    Py_INCREF(v);
    Py_DECREF(r);
    *off = n;
    return v;
}

/* What CPython's collector does to a tuple of atoms at its first pass
 * (_PyTuple_MaybeUntrack), done at once: row images hold only ints, str,
 * bytes, Decimals, dates..., so the collector never has to traverse them. */
static void untrack_if_atomic(PyObject *t) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
        PyObject *v = PyTuple_GET_ITEM(t, i);
        if (PyObject_IS_GC(v) && (!PyTuple_CheckExact(v) || PyObject_GC_IsTracked(v))) return;
    }
    PyObject_GC_UnTrack(t);
}

#define NEED(k) do { if (off + (Py_ssize_t)(k) > end) goto truncated; } while (0)

static PyObject *decode_decimal_text(ColPlan *c, const unsigned char *p);

static PyObject *decode_decimal(ColPlan *c, const unsigned char *p) {
    if (!get_cache(c)) return decode_decimal_text(c, p);
    uint64_t key = be(p, c->dsize);
    VSlot *slot = vslot(c, key);
    if (!slot->v || slot->key != key) {
        PyObject *v = decode_decimal_text(c, p);
        if (!v) return NULL;
        Py_XSETREF(slot->v, v);
        slot->key = key;
    }
    Py_INCREF(slot->v);
    return slot->v;
}

static PyObject *decode_decimal_text(ColPlan *c, const unsigned char *p) {
    unsigned char b[80];
    int size = c->dsize;
    if (size > (int)sizeof(b)) { PyErr_SetString(Fallback, "decimal too wide"); return NULL; }
    memcpy(b, p, size);
    /* The stored sign bit is 1 for positive numbers; a negative number has
     * every byte inverted.  After this, b holds the magnitude. */
    int negative = !(b[0] & 0x80);
    b[0] ^= 0x80;
    if (negative)
        for (int i = 0; i < size; i++) b[i] = (unsigned char)~b[i];
    char text[160];
    int t = 0, pos = 0;
    if (negative) text[t++] = '-';
    for (int g = 0; g < c->ngroups; g++) {
        uint32_t v = (uint32_t)be(b + pos, c->gbytes[g]);
        int nd = c->gdigits[g];
        pos += c->gbytes[g];
        /* The reference folds groups as n = n * 10**digits + group; that is
         * the zero-padded concatenation only while group < 10**digits. */
        if (v >= POW10[nd]) { PyErr_SetString(Fallback, "decimal group out of range"); return NULL; }
        for (int k = nd - 1; k >= 0; k--) { text[t + k] = (char)('0' + v % 10); v /= 10; }
        t += nd;
    }
    if (c->ngroups == 0) text[t++] = '0';
    /* The last b digits are the fraction: "int.frac" is the same Decimal as
     * "digitsE-b" (coefficient and exponent), without a snprintf per value. */
    int scale = (int)c->b, ndig = t - negative;
    if (scale > 0 && scale <= ndig) {
        memmove(text + t - scale + 1, text + t - scale, (size_t)scale);
        text[t - scale] = '.';
        t++;
    } else if (scale > 0) {
        t += snprintf(text + t, sizeof(text) - t, "E%d", -scale);
    }
    PyObject *s = PyUnicode_FromStringAndSize(text, t);
    if (!s) return NULL;
    PyObject *d = PyObject_CallOneArg(DecimalType, s);
    Py_DECREF(s);
    return d;
}

static PyObject *read_image(ColPlan *cols, Py_ssize_t n, PyObject *body, const unsigned char *buf,
                            Py_ssize_t *poff, Py_ssize_t end) {
    Py_ssize_t off = *poff;
    Py_ssize_t null_len = (n + 7) >> 3;
    PyObject *row = NULL;
    NEED(null_len);
    const unsigned char *nulls = buf + off;
    off += null_len;
    row = PyTuple_New(n);
    if (!row) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        ColPlan *c = &cols[i];
        PyObject *v = NULL;
        if (nulls[i >> 3] >> (i & 7) & 1) {
            Py_INCREF(Py_None);
            PyTuple_SET_ITEM(row, i, Py_None);
            continue;
        }
        const unsigned char *p = buf + off;
        switch (c->kind) {
        case K_INT: {
            int size = (int)c->a;
            NEED(size);
            uint64_t u = le(p, size);
            off += size;
            if (c->b) {
                v = PyLong_FromUnsignedLongLong(u);
            } else {
                int shift = 64 - 8 * size;
                int64_t s = shift ? (int64_t)(u << shift) >> shift : (int64_t)u;
                v = PyLong_FromLongLong(s);
            }
            break;
        }
        case K_FLOAT: {
            NEED(4);
            float f;
            memcpy(&f, p, 4);  /* x86/ARM little-endian, as the binlog */
            off += 4;
            v = PyFloat_FromDouble((double)f);
            break;
        }
        case K_DOUBLE: {
            NEED(8);
            double d;
            memcpy(&d, p, 8);
            off += 8;
            v = PyFloat_FromDouble(d);
            break;
        }
        case K_DECIMAL:
            NEED(c->dsize);
            v = decode_decimal(c, p);
            off += c->dsize;
            break;
        case K_TEXT_UTF8:
        case K_TEXT_CODEC:
        case K_BYTES:
        case K_BINARY_FIXED: {
            int pre = (int)c->a;
            NEED(pre);
            Py_ssize_t len = (Py_ssize_t)le(p, pre);
            NEED(pre + len);
            const char *s = (const char *)p + pre;
            SSlot *slot = NULL;
            if (c->kind == K_TEXT_UTF8 && len <= SCACHE_MAXLEN && get_cache(c)) {
                slot = sslot((SSlot *)c->cache, s, len);
                if ((v = sslot_hit(slot, s, len))) {
                    off += pre + len;
                    break;
                }
            }
            if (c->kind == K_TEXT_UTF8 || c->kind == K_TEXT_CODEC) {
                v = c->kind == K_TEXT_UTF8 ? PyUnicode_DecodeUTF8(s, len, "strict")
                                           : PyUnicode_Decode(s, len, c->codec, "strict");
                if (v && slot) sslot_keep(slot, s, len, v);
                if (!v) {
                    /* Let the pure decoder raise its own, explanatory error. */
                    PyErr_Clear();
                    v = call_pydec(c, body, &off);
                    break;
                }
            } else if (c->kind == K_BYTES) {
                v = PyBytes_FromStringAndSize(s, len);
            } else {
                /* BINARY(n) is stored without its trailing 0x00 padding. */
                Py_ssize_t width = c->b > len ? c->b : len;
                v = PyBytes_FromStringAndSize(NULL, width);
                if (v) {
                    memcpy(PyBytes_AS_STRING(v), s, len);
                    memset(PyBytes_AS_STRING(v) + len, 0, width - len);
                }
            }
            off += pre + len;
            break;
        }
        case K_DATE: {
            NEED(3);
            uint32_t d = (uint32_t)le(p, 3);
            int y = d >> 9, m = (d >> 5) & 15, dd = d & 31;
            if (!valid_date(y, m, dd)) { v = call_pydec(c, body, &off); break; }
            off += 3;
            if (!get_cache(c)) { v = PyDate_FromDate(y, m, dd); break; }
            VSlot *slot = vslot(c, d);
            if (!slot->v || slot->key != d) {
                if (!(v = PyDate_FromDate(y, m, dd))) break;
                Py_XSETREF(slot->v, v);
                slot->key = d;
            }
            v = slot->v;
            Py_INCREF(v);
            break;
        }
        case K_DATETIME2: {
            int fsp = (int)c->a, nf = FSP_BYTES[fsp];
            NEED(5 + nf);
            int64_t ip = (int64_t)be(p, 5) - 0x8000000000LL;
            long micro = nf ? (long)be(p + 5, nf) * FSP_SCALE[fsp] : 0;
            if (ip < 0) { v = call_pydec(c, body, &off); break; }
            int64_t ymd = ip >> 17, hms = ip & 0x1FFFF;
            int64_t ym = ymd >> 5;
            int day = (int)(ymd & 31), year = (int)(ym / 13), month = (int)(ym % 13);
            int hour = (int)(hms >> 12), minute = (int)((hms >> 6) & 63), second = (int)(hms & 63);
            if (!valid_date(year, month, day) || hour > 23 || minute > 59 || second > 59 || micro > 999999) {
                v = call_pydec(c, body, &off);  /* zero date: MySQL's text */
                break;
            }
            off += 5 + nf;
            v = PyDateTime_FromDateAndTime(year, month, day, hour, minute, second, (int)micro);
            break;
        }
        case K_TIMESTAMP2: {
            int fsp = (int)c->a, nf = FSP_BYTES[fsp];
            NEED(4 + nf);
            int64_t sec = (int64_t)be(p, 4);
            long micro = nf ? (long)be(p + 4, nf) * FSP_SCALE[fsp] : 0;
            if ((sec == 0 && micro == 0) || micro > 999999) { v = call_pydec(c, body, &off); break; }
            off += 4 + nf;
            int y, m, d;
            int64_t days = sec / 86400, rem = sec % 86400;
            civil_from_days(days, &y, &m, &d);
            v = PyDateTimeAPI->DateTime_FromDateAndTime(y, m, d, (int)(rem / 3600), (int)(rem / 60 % 60),
                                                        (int)(rem % 60), (int)micro, PyDateTime_TimeZone_UTC,
                                                        PyDateTimeAPI->DateTimeType);
            break;
        }
        case K_TIME2: {
            /* my_time_packed_from_binary: a biased integer part and a
             * fraction whose borrow is undone for negative values. */
            int fsp = (int)c->a;
            int64_t packed;
            int size;
            if (fsp >= 5) {
                NEED(6);
                packed = (int64_t)be(p, 6) - 0x800000000000LL;
                size = 6;
            } else {
                NEED(3 + FSP_BYTES[fsp]);
                int64_t intpart = (int64_t)be(p, 3) - 0x800000;
                int64_t frac = 0;
                size = 3;
                if (fsp) {
                    int nb = FSP_BYTES[fsp];
                    frac = (int64_t)be(p + 3, nb);
                    size += nb;
                    if (intpart < 0 && frac) {
                        intpart += 1;
                        frac -= nb == 1 ? 0x100 : 0x10000;
                    }
                    frac *= FSP_SCALE[fsp];
                }
                packed = intpart * (1LL << 24) + frac;
            }
            int neg = packed < 0;
            if (neg) packed = -packed;
            int64_t hms = packed >> 24, micro = packed & 0xFFFFFF;
            int64_t total = ((((hms >> 12) & 0x3FF) * 60 + ((hms >> 6) & 63)) * 60 + (hms & 63)) * 1000000LL + micro;
            if (neg) total = -total;
            int64_t dday = 86400000000LL;
            int64_t days = total >= 0 ? total / dday : -((-total + dday - 1) / dday);
            int64_t r = total - days * dday;
            off += size;
            v = PyDelta_FromDSU((int)days, (int)(r / 1000000), (int)(r % 1000000));
            break;
        }
        case K_YEAR:
            NEED(1);
            v = PyLong_FromLong(p[0] ? p[0] + 1900 : 0);
            off += 1;
            break;
        case K_BIT: {
            int nb = (int)c->a;
            NEED(nb);
            v = PyLong_FromUnsignedLongLong(be(p, nb));
            off += nb;
            break;
        }
        case K_ENUM: {
            int size = (int)c->a;
            NEED(size);
            uint64_t idx = le(p, size);
            off += size;
            if (idx < (uint64_t)PyList_GET_SIZE(c->obj)) {
                v = PyList_GET_ITEM(c->obj, (Py_ssize_t)idx);
                Py_INCREF(v);
            } else {
                v = PyUnicode_FromStringAndSize("", 0);
            }
            break;
        }
        case K_NULL:
            v = Py_None;
            Py_INCREF(v);
            break;
        case K_SET: {
            /* The members whose bits are set, in declared order, joined by
             * commas: parser/rows.py _set, value for value. */
            int size = (int)c->a;
            NEED(size);
            uint64_t mask = le(p, size);
            off += size;
            if (c->set_text && c->set_mask == mask) {
                v = c->set_text;
                Py_INCREF(v);
                break;
            }
            Py_ssize_t nm = PyList_GET_SIZE(c->obj);
            PyObject *parts = PyList_New(0);
            if (!parts) { Py_DECREF(row); return NULL; }
            for (Py_ssize_t k = 0; k < nm && k < 64; k++) {
                if ((mask >> k) & 1) {
                    if (PyList_Append(parts, PyList_GET_ITEM(c->obj, k)) < 0) {
                        Py_DECREF(parts); Py_DECREF(row); return NULL;
                    }
                }
            }
            v = PyUnicode_Join(S_comma, parts);
            Py_DECREF(parts);
            if (v) {
                Py_INCREF(v);
                Py_XSETREF(c->set_text, v);
                c->set_mask = mask;
            }
            break;
        }
        default:
            v = call_pydec(c, body, &off);
        }
        if (!v) { Py_DECREF(row); return NULL; }
        PyTuple_SET_ITEM(row, i, v);
        if (off > end) goto truncated;
    }
    *poff = off;
    untrack_if_atomic(row);
    return row;
truncated:
    Py_XDECREF(row);
    PyErr_SetString(Fallback, "row image runs past the end of the event");
    return NULL;
}

/* Plan(spec): a table's compiled decode plan, made once per TABLE_MAP
 * (TableDecoder), holding its value caches. */
typedef struct {
    PyObject_HEAD
    PyObject *spec;       /* the plan tuple: keeps the borrowed obj/pydec alive */
    ColPlan *cols;
    Py_ssize_t n;
} PlanObject;

static PyObject *Plan_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *spec;
    if (!PyArg_ParseTuple(args, "O!:Plan", &PyTuple_Type, &spec)) return NULL;
    PlanObject *self = (PlanObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    if (build_plan(spec, &self->cols, &self->n) < 0) { Py_DECREF(self); return NULL; }
    Py_INCREF(spec);
    self->spec = spec;
    return (PyObject *)self;
}

static void Plan_dealloc(PlanObject *self) {
    if (self->cols) free_plan(self->cols, self->n);
    Py_XDECREF(self->spec);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cynomys._speedups.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(spec): the compiled decode plan of one table (see parser/rows.py _plan_for)",
    .tp_new = Plan_new,
    .tp_dealloc = (destructor)Plan_dealloc,
};

static PyObject *decode_rows(PyObject *self, PyObject *args) {
    PyObject *body;
    PlanObject *plan;
    int pairs;
    if (!PyArg_ParseTuple(args, "SO!p:decode_rows", &body, &PlanType, &plan, &pairs)) return NULL;
    ColPlan *cols = plan->cols;
    Py_ssize_t n = plan->n;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(body);
    Py_ssize_t end = PyBytes_GET_SIZE(body), off = 0;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    while (off < end) {
        PyObject *first = read_image(cols, n, body, buf, &off, end), *second = NULL, *pair;
        if (!first) goto fail;
        if (pairs) {
            second = read_image(cols, n, body, buf, &off, end);
            if (!second) { Py_DECREF(first); goto fail; }
        } else {
            second = Py_None;
            Py_INCREF(second);
        }
        pair = PyTuple_New(2);
        if (!pair) { Py_DECREF(first); Py_DECREF(second); goto fail; }
        PyTuple_SET_ITEM(pair, 0, first);
        PyTuple_SET_ITEM(pair, 1, second);
        untrack_if_atomic(pair);
        if (PyList_Append(out, pair) < 0) { Py_DECREF(pair); goto fail; }
        Py_DECREF(pair);
    }
    return out;
fail:
    Py_CLEAR(out);
    return NULL;
}

/* ======================================================================
 * Avro encoding of a Batch (schemas/batch.v1.avsc), byte-for-byte what
 * fastavro's schemaless_writer writes for codec.py's datum:
 *   long/int: zig-zag varint; string/bytes: long length + bytes;
 *   boolean: one byte; double: 8 bytes little-endian;
 *   array/map: one block (count, items) then a 0 count -- an empty one is
 *   just the 0; union: the branch index as a long, then the value.
 * ==================================================================== */

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t need) {
    if (b->len + need <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + need) cap *= 2;
    char *p = PyMem_Realloc(b->p, cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int put_long(Buf *b, int64_t n) {
    if (buf_grow(b, 10) < 0) return -1;
    uint64_t z = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    unsigned char *o = (unsigned char *)b->p + b->len;
    int i = 0;
    while (z & ~0x7FULL) { o[i++] = (unsigned char)((z & 0x7F) | 0x80); z >>= 7; }
    o[i++] = (unsigned char)z;
    b->len += i;
    return 0;
}

static inline int put_raw(Buf *b, const char *s, Py_ssize_t n) {
    if (put_long(b, n) < 0 || buf_grow(b, n) < 0) return -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

static int put_double(Buf *b, double d) {
    if (buf_grow(b, 8) < 0) return -1;
    memcpy(b->p + b->len, &d, 8);
    b->len += 8;
    return 0;
}

static int put_byte(Buf *b, int v) {
    if (buf_grow(b, 1) < 0) return -1;
    b->p[b->len++] = (char)v;
    return 0;
}

static int fallback(const char *why) {
    PyErr_SetString(Fallback, why);
    return -1;
}

/* An exact str (not a subclass) as Avro string. */
static int put_str(Buf *b, PyObject *s) {
    if (!PyUnicode_CheckExact(s)) return fallback("expected a str");
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (!u) { PyErr_Clear(); return fallback("str not encodable as UTF-8"); }
    return put_raw(b, u, n);
}

/* str(v) as Avro string (DECIMAL text, big integers, RawTemporal). */
static int put_str_of(Buf *b, PyObject *v) {
    PyObject *s = PyObject_Str(v);
    if (!s) return -1;
    int r = put_str(b, s);
    Py_DECREF(s);
    return r;
}

static int put_int_obj(Buf *b, PyObject *v) {
    if (!PyLong_CheckExact(v)) return fallback("expected an int");
    int overflow;
    long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (n == -1 && PyErr_Occurred())) { PyErr_Clear(); return fallback("int beyond int64"); }
    return put_long(b, n);
}

static PyObject *S_file, *S_pos, *S_gtid, *S_database, *S_table, *S_columns, *S_key, *S_indexes, *S_name, *S_type,
    *S_nullable, *S_tid, *S_sql, *S_op, *S_txn, *S_commit_ts, *S_schema, *S_before, *S_after, *S_images;

static int put_attr_str(Buf *b, PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) return -1;
    int r = put_str(b, v);
    Py_DECREF(v);
    return r;
}

static int put_attr_int(Buf *b, PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) return -1;
    int r = put_int_obj(b, v);
    Py_DECREF(v);
    return r;
}

static int put_position(Buf *b, PyObject *p) {
    if (put_attr_str(b, p, S_file) < 0 || put_attr_int(b, p, S_pos) < 0 || put_attr_str(b, p, S_gtid) < 0) return -1;
    return 0;
}

/* Value kinds of a column, as codec._encode_column sees type(value). */
enum { V_NONE, V_INT, V_BOOL, V_FLOAT, V_STR, V_BYTES, V_DECIMAL, V_DATE, V_DATETIME, V_TIMEDELTA, V_RAWTEMPORAL };

static int value_kind(PyObject *v) {
    PyTypeObject *t = Py_TYPE(v);
    if (v == Py_None) return V_NONE;
    if (t == &PyLong_Type) return V_INT;
    if (t == &PyUnicode_Type) return V_STR;
    if (t == &PyFloat_Type) return V_FLOAT;
    if (t == &PyBytes_Type) return V_BYTES;
    if ((PyObject *)t == DecimalType) return V_DECIMAL;
    if (t == PyDateTimeAPI->DateType) return V_DATE;
    if (t == PyDateTimeAPI->DateTimeType) return V_DATETIME;
    if (t == PyDateTimeAPI->DeltaType) return V_TIMEDELTA;
    if (t == &PyBool_Type) return V_BOOL;
    if ((PyObject *)t == RawTemporalType) return V_RAWTEMPORAL;
    return -1;  /* bytearray, memoryview, unknown: the pure path decides */
}

static int64_t date_days(PyObject *v) {
    return days_from_civil(PyDateTime_GET_YEAR(v), PyDateTime_GET_MONTH(v), PyDateTime_GET_DAY(v));
}

static int64_t datetime_us(PyObject *v) {
    int64_t days = date_days(v);
    return ((days * 24 + PyDateTime_DATE_GET_HOUR(v)) * 60 + PyDateTime_DATE_GET_MINUTE(v)) * 60000000LL
           + PyDateTime_DATE_GET_SECOND(v) * 1000000LL + PyDateTime_DATE_GET_MICROSECOND(v);
}

static int64_t delta_us(PyObject *v) {
    return ((int64_t)PyDateTime_DELTA_GET_DAYS(v) * 86400 + PyDateTime_DELTA_GET_SECONDS(v)) * 1000000LL
           + PyDateTime_DELTA_GET_MICROSECONDS(v);
}

/* Aware datetimes: only UTC (what the decoder makes) is computed here. */
static int dt_tz(PyObject *v) {
    PyObject *tz = PyDateTime_DATE_GET_TZINFO(v);
    if (tz == Py_None) return 0;
    if (tz == PyDateTime_TimeZone_UTC) return 1;
    return -1;
}

/* Union branches of MixedColumn's items and of the column union. */
enum { M_NULL, M_LONG, M_DOUBLE, M_STRING, M_BYTES, M_DECIMAL, M_BIGINT, M_DATE, M_DATETIME, M_TIMESTAMP, M_TIME,
       M_RAWTEMPORAL };
enum { C_LONG, C_DOUBLE, C_STRING, C_BYTES, C_DECIMAL, C_BIGINT, C_DATE, C_DATETIME, C_TIMESTAMP, C_TIME, C_MIXED };

static int put_tagged(Buf *b, PyObject *v) {
    switch (value_kind(v)) {
    case V_NONE: return put_long(b, M_NULL);
    case V_INT: {
        int overflow;
        long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (n == -1 && PyErr_Occurred()) return -1;
        if (overflow) return put_long(b, M_BIGINT) < 0 ? -1 : put_str_of(b, v);
        return put_long(b, M_LONG) < 0 ? -1 : put_long(b, n);
    }
    case V_BOOL: return put_long(b, M_LONG) < 0 ? -1 : put_long(b, v == Py_True);
    case V_FLOAT: return put_long(b, M_DOUBLE) < 0 ? -1 : put_double(b, PyFloat_AS_DOUBLE(v));
    case V_STR: return put_long(b, M_STRING) < 0 ? -1 : put_str(b, v);
    case V_BYTES: return put_long(b, M_BYTES) < 0 ? -1 : put_raw(b, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v));
    case V_DECIMAL: return put_long(b, M_DECIMAL) < 0 ? -1 : put_str_of(b, v);
    case V_DATE: return put_long(b, M_DATE) < 0 ? -1 : put_long(b, date_days(v));
    case V_DATETIME: {
        int tz = dt_tz(v);
        if (tz < 0) return fallback("datetime in a time zone other than UTC");
        return put_long(b, tz ? M_TIMESTAMP : M_DATETIME) < 0 ? -1 : put_long(b, datetime_us(v));
    }
    case V_TIMEDELTA: return put_long(b, M_TIME) < 0 ? -1 : put_long(b, delta_us(v));
    case V_RAWTEMPORAL: return put_long(b, M_RAWTEMPORAL) < 0 ? -1 : put_str_of(b, v);
    }
    return fallback("value type for the pure encoder");
}

/* str(Decimal) by object identity within one column: the decoder hands out
 * one object per distinct DECIMAL field, and the batch keeps every value
 * alive during the call, so equal pointers are the same value. */
#define STR_CACHE 256
typedef struct { PyObject *key, *text; } StrSlot;

static int put_decimal_cached(Buf *b, PyObject *v, StrSlot *cache) {
    StrSlot *slot = &cache[((uintptr_t)v >> 4) % STR_CACHE];
    if (slot->key != v) {
        PyObject *s = PyObject_Str(v);
        if (!s) return -1;
        Py_XSETREF(slot->text, s);
        slot->key = v;
    }
    return put_str(b, slot->text);
}

/* One column of a block: codec._encode_column. */
static int put_column(Buf *b, PyObject **rows, Py_ssize_t nrows, Py_ssize_t col) {
    unsigned mask = 0;
    Py_ssize_t nnull = 0;
    int big = 0, naive = 0, aware = 0;
    for (Py_ssize_t r = 0; r < nrows; r++) {
        PyObject *v = PyTuple_GET_ITEM(rows[r], col);
        int k = value_kind(v);
        if (k < 0) return fallback("value type for the pure encoder");
        if (k == V_NONE) { nnull++; continue; }
        mask |= 1u << k;
        if (k == V_INT && !big) {
            int overflow;
            long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (n == -1 && PyErr_Occurred()) return -1;
            big = overflow != 0;
        } else if (k == V_DATETIME) {
            int tz = dt_tz(v);
            if (tz < 0) return fallback("datetime in a time zone other than UTC");
            if (tz) aware = 1; else naive = 1;
        }
    }
    int cls;
    switch (mask) {
    case 0: cls = C_LONG; break;
    case 1u << V_INT: cls = big ? C_BIGINT : C_LONG; break;
    case 1u << V_BOOL: cls = C_LONG; break;
    case 1u << V_FLOAT: cls = C_DOUBLE; break;
    case 1u << V_STR: cls = C_STRING; break;
    case 1u << V_BYTES: cls = C_BYTES; break;
    case 1u << V_DECIMAL: cls = C_DECIMAL; break;
    case 1u << V_DATE: cls = C_DATE; break;
    case 1u << V_TIMEDELTA: cls = C_TIME; break;
    case 1u << V_DATETIME: cls = naive && aware ? C_MIXED : aware ? C_TIMESTAMP : C_DATETIME; break;
    default: cls = C_MIXED;  /* several kinds, or RawTemporal alone */
    }
    if (put_long(b, cls) < 0) return -1;
    if (cls == C_MIXED) {  /* NULLs inline, one tagged value each */
        if (nrows && put_long(b, nrows) < 0) return -1;
        for (Py_ssize_t r = 0; r < nrows; r++)
            if (put_tagged(b, PyTuple_GET_ITEM(rows[r], col)) < 0) return -1;
        return put_long(b, 0);
    }
    /* nulls: the row indexes of the NULLs */
    if (nnull) {
        if (put_long(b, nnull) < 0) return -1;
        for (Py_ssize_t r = 0; r < nrows; r++)
            if (PyTuple_GET_ITEM(rows[r], col) == Py_None && put_long(b, r) < 0) return -1;
    }
    if (put_long(b, 0) < 0) return -1;
    /* v: the non-NULL values, in row order */
    Py_ssize_t npresent = nrows - nnull;
    if (npresent && put_long(b, npresent) < 0) return -1;
    if (cls == C_DECIMAL) {
        StrSlot cache[STR_CACHE] = {{0}};
        int rc = 0;
        for (Py_ssize_t r = 0; rc == 0 && r < nrows; r++) {
            PyObject *v = PyTuple_GET_ITEM(rows[r], col);
            if (v != Py_None) rc = put_decimal_cached(b, v, cache);
        }
        for (int i = 0; i < STR_CACHE; i++) Py_XDECREF(cache[i].text);
        return rc < 0 ? -1 : put_long(b, 0);
    }
    for (Py_ssize_t r = 0; npresent && r < nrows; r++) {
        PyObject *v = PyTuple_GET_ITEM(rows[r], col);
        int rc = 0;
        if (v == Py_None) continue;
        switch (cls) {
        case C_LONG:
            rc = Py_TYPE(v) == &PyBool_Type ? put_long(b, v == Py_True) : put_long(b, PyLong_AsLongLong(v));
            break;
        case C_BIGINT: rc = put_str_of(b, v); break;
        case C_DOUBLE: rc = put_double(b, PyFloat_AS_DOUBLE(v)); break;
        case C_STRING: rc = put_str(b, v); break;
        case C_BYTES: rc = put_raw(b, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v)); break;
        case C_DATE: rc = put_long(b, date_days(v)); break;
        case C_DATETIME: case C_TIMESTAMP: rc = put_long(b, datetime_us(v)); break;
        case C_TIME: rc = put_long(b, delta_us(v)); break;
        }
        if (rc < 0) return -1;
    }
    return put_long(b, 0);
}

typedef struct {
    PyObject *schema;     /* borrowed: the first object seen for this table */
    PyObject **rows;      /* borrowed row images, in order */
    Py_ssize_t nrows, cap;
} TableImages;

typedef struct {
    TableImages *t;
    Py_ssize_t n, cap;
    PyObject **alias;     /* schema objects seen (identity), parallel to alias_ref */
    Py_ssize_t *alias_ref;
    Py_ssize_t nalias, alias_cap;
} Tables;

static void tables_free(Tables *ts) {
    for (Py_ssize_t i = 0; i < ts->n; i++) PyMem_Free(ts->t[i].rows);
    PyMem_Free(ts->t);
    PyMem_Free(ts->alias);
    PyMem_Free(ts->alias_ref);
}

/* codec.encode's table_ref(): by identity first, then by value (equal
 * schemas from different objects share one ref). */
static Py_ssize_t table_ref(Tables *ts, PyObject *schema) {
    for (Py_ssize_t i = ts->nalias - 1; i >= 0; i--)
        if (ts->alias[i] == schema) return ts->alias_ref[i];
    Py_ssize_t ref = -1;
    for (Py_ssize_t i = 0; i < ts->n && ref < 0; i++) {
        int eq = PyObject_RichCompareBool(ts->t[i].schema, schema, Py_EQ);
        if (eq < 0) return -2;
        if (eq) ref = i;
    }
    if (ref < 0) {
        if (ts->n == ts->cap) {
            Py_ssize_t cap = ts->cap ? ts->cap * 2 : 8;
            TableImages *t = PyMem_Realloc(ts->t, cap * sizeof(TableImages));
            if (!t) { PyErr_NoMemory(); return -2; }
            ts->t = t;
            ts->cap = cap;
        }
        ref = ts->n++;
        ts->t[ref] = (TableImages){schema, NULL, 0, 0};
    }
    if (ts->nalias == ts->alias_cap) {
        Py_ssize_t cap = ts->alias_cap ? ts->alias_cap * 2 : 8;
        PyObject **a = PyMem_Realloc(ts->alias, cap * sizeof(PyObject *));
        if (!a) { PyErr_NoMemory(); return -2; }
        ts->alias = a;
        Py_ssize_t *r = PyMem_Realloc(ts->alias_ref, cap * sizeof(Py_ssize_t));
        if (!r) { PyErr_NoMemory(); return -2; }
        ts->alias_ref = r;
        ts->alias_cap = cap;
    }
    ts->alias[ts->nalias] = schema;
    ts->alias_ref[ts->nalias++] = ref;
    return ref;
}

static Py_ssize_t add_image(TableImages *t, PyObject *row) {
    if (t->nrows == t->cap) {
        Py_ssize_t cap = t->cap ? t->cap * 2 : 256;
        PyObject **r = PyMem_Realloc(t->rows, cap * sizeof(PyObject *));
        if (!r) { PyErr_NoMemory(); return -1; }
        t->rows = r;
        t->cap = cap;
    }
    t->rows[t->nrows] = row;
    return t->nrows++;
}

/* One TableDef; ``indexes``: the schema's version holds TableDef.indexes (v3). */
static int put_table_def(Buf *b, PyObject *schema, int indexes) {
    int rc = -1;
    PyObject *cols = NULL, *key = NULL, *idx = NULL;
    if (put_attr_str(b, schema, S_database) < 0 || put_attr_str(b, schema, S_table) < 0) return -1;
    cols = PyObject_GetAttr(schema, S_columns);
    if (!cols) goto done;
    if (!PyTuple_CheckExact(cols)) { fallback("schema columns not a tuple"); goto done; }
    Py_ssize_t n = PyTuple_GET_SIZE(cols);
    if (n && put_long(b, n) < 0) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PyTuple_GET_ITEM(cols, i), *nullable;
        if (put_attr_str(b, c, S_name) < 0 || put_attr_str(b, c, S_type) < 0) goto done;
        nullable = PyObject_GetAttr(c, S_nullable);
        if (!nullable) goto done;
        int t = PyObject_IsTrue(nullable);
        Py_DECREF(nullable);
        if (t < 0 || put_byte(b, t) < 0) goto done;
    }
    if (put_long(b, 0) < 0) goto done;
    key = PyObject_GetAttr(schema, S_key);
    if (!key) goto done;
    if (!PyTuple_CheckExact(key)) { fallback("schema key not a tuple"); goto done; }
    n = PyTuple_GET_SIZE(key);
    if (n && put_long(b, n) < 0) goto done;
    for (Py_ssize_t i = 0; i < n; i++)
        if (put_str(b, PyTuple_GET_ITEM(key, i)) < 0) goto done;
    if (put_long(b, 0) < 0) goto done;
    if (indexes) {
        idx = PyObject_GetAttr(schema, S_indexes);
        if (!idx) goto done;
        if (!PyTuple_CheckExact(idx)) { fallback("schema indexes not a tuple"); goto done; }
        n = PyTuple_GET_SIZE(idx);
        if (n && put_long(b, n) < 0) goto done;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *one = PyTuple_GET_ITEM(idx, i);
            if (!PyTuple_CheckExact(one)) { fallback("schema index not a tuple"); goto done; }
            Py_ssize_t m = PyTuple_GET_SIZE(one);
            if (m && put_long(b, m) < 0) goto done;
            for (Py_ssize_t j = 0; j < m; j++)
                if (put_str(b, PyTuple_GET_ITEM(one, j)) < 0) goto done;
            if (put_long(b, 0) < 0) goto done;
        }
        if (put_long(b, 0) < 0) goto done;
    }
    rc = 0;
done:
    Py_XDECREF(cols);
    Py_XDECREF(key);
    Py_XDECREF(idx);
    return rc;
}

/* encode_batch(prefix, producer_id, end, complete, first_txn, created_us,
 *              last_commit_ts, meta, changes, op_index) -> bytes */
static PyObject *encode_batch(PyObject *self, PyObject *args) {
    PyObject *prefix, *producer_id, *end, *complete, *first_txn, *created_us, *last_commit_ts, *meta, *changes,
        *op_index, *many_rows_type = NULL;
    if (!PyArg_ParseTuple(args, "SOOOOOOO!O!O!|O:encode_batch", &prefix, &producer_id, &end, &complete, &first_txn,
                          &created_us, &last_commit_ts, &PyDict_Type, &meta, &PyTuple_Type, &changes, &PyDict_Type,
                          &op_index, &many_rows_type))
        return NULL;
    Buf b = {NULL, 0, 0};
    Tables ts = {0};
    Py_ssize_t nchanges = PyTuple_GET_SIZE(changes);
    /* per change: table ref, before image, after image (a ManyRows: its first
     * row's image; its rows' images follow each other), rows (-1: a Change) */
    Py_ssize_t *refs = PyMem_Malloc(4 * (nchanges ? nchanges : 1) * sizeof(Py_ssize_t));
    Py_ssize_t nrecords = 0;
    PyObject *out = NULL;
    if (!refs) { PyErr_NoMemory(); goto done; }

    /* Pass 1: table refs and row-image indexes (records point into images). */
    for (Py_ssize_t i = 0; i < nchanges; i++) {
        PyObject *c = PyTuple_GET_ITEM(changes, i);
        PyObject *schema = PyObject_GetAttr(c, S_schema);
        if (!schema) goto done;
        Py_ssize_t ref = -1, img[2] = {-1, -1};
        if (schema != Py_None) {
            ref = table_ref(&ts, schema);
            if (ref == -2) { Py_DECREF(schema); goto done; }
        }
        Py_DECREF(schema);  /* the change keeps it alive */
        if (many_rows_type && (PyObject *)Py_TYPE(c) == many_rows_type) {
            /* a ManyRows (core.columnar): one record of its op per row */
            PyObject *images = PyObject_GetAttr(c, S_images);
            if (!images) goto done;
            Py_DECREF(images);  /* borrowed from the change */
            if (ref < 0 || !PyTuple_CheckExact(images)) { fallback("ManyRows the pure encoder must judge"); goto done; }
            Py_ssize_t n = PyTuple_GET_SIZE(images), first = -1;
            for (Py_ssize_t j = 0; j < n; j++) {
                PyObject *row = PyTuple_GET_ITEM(images, j);
                if (!PyTuple_CheckExact(row)) { fallback("row image the pure encoder must judge"); goto done; }
                Py_ssize_t at = add_image(&ts.t[ref], row);
                if (at < 0) goto done;
                if (j == 0) first = at;
            }
            refs[4 * i] = ref;
            refs[4 * i + 1] = -1;
            refs[4 * i + 2] = first;
            refs[4 * i + 3] = n;
            nrecords += n;
            continue;
        }
        PyObject *names[2] = {S_before, S_after};
        for (int k = 0; k < 2; k++) {
            PyObject *row = PyObject_GetAttr(c, names[k]);
            if (!row) goto done;
            Py_DECREF(row);  /* borrowed from the change */
            if (row == Py_None) continue;
            if (ref < 0 || !PyTuple_CheckExact(row)) { fallback("row image the pure encoder must judge"); goto done; }
            img[k] = add_image(&ts.t[ref], row);
            if (img[k] < 0) goto done;
        }
        refs[4 * i] = ref;
        refs[4 * i + 1] = img[0];
        refs[4 * i + 2] = img[1];
        refs[4 * i + 3] = -1;
        nrecords++;
    }

    if (buf_grow(&b, PyBytes_GET_SIZE(prefix)) < 0) goto done;
    memcpy(b.p, PyBytes_AS_STRING(prefix), PyBytes_GET_SIZE(prefix));
    b.len = PyBytes_GET_SIZE(prefix);
    int truth;
    if (put_str(&b, producer_id) < 0 || put_position(&b, end) < 0) goto done;
    if ((truth = PyObject_IsTrue(complete)) < 0 || put_byte(&b, truth) < 0) goto done;
    if (first_txn == Py_None) {
        if (put_long(&b, 0) < 0) goto done;
    } else if (put_long(&b, 1) < 0 || put_position(&b, first_txn) < 0) goto done;
    if (put_int_obj(&b, created_us) < 0 || put_int_obj(&b, last_commit_ts) < 0) goto done;
    if (PyDict_GET_SIZE(meta) && put_long(&b, PyDict_GET_SIZE(meta)) < 0) goto done;
    {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(meta, &pos, &k, &v))
            if (put_str(&b, k) < 0 || put_str(&b, v) < 0) goto done;
    }
    if (put_long(&b, 0) < 0) goto done;

    /* tables */
    if (ts.n && put_long(&b, ts.n) < 0) goto done;
    for (Py_ssize_t i = 0; i < ts.n; i++)
        if (put_table_def(&b, ts.t[i].schema, PyBytes_AS_STRING(prefix)[PyBytes_GET_SIZE(prefix) - 1] >= 3) < 0) goto done;
    if (put_long(&b, 0) < 0) goto done;

    /* records */
    if (nrecords && put_long(&b, nrecords) < 0) goto done;
    for (Py_ssize_t i = 0; i < nchanges; i++) {
        PyObject *c = PyTuple_GET_ITEM(changes, i), *v;
        Py_ssize_t head = b.len;  /* a ManyRows repeats this record's header for each row */
        if (put_attr_str(&b, c, S_tid) < 0 || put_attr_str(&b, c, S_database) < 0
            || put_attr_str(&b, c, S_table) < 0)
            goto done;
        if (!(v = PyObject_GetAttr(c, S_sql))) goto done;
        int rc = v == Py_None ? put_long(&b, 0) : (put_long(&b, 1) < 0 ? -1 : put_str(&b, v));
        Py_DECREF(v);
        if (rc < 0) goto done;
        if (!(v = PyObject_GetAttr(c, S_op))) goto done;
        PyObject *idx = PyDict_GetItemWithError(op_index, v);
        Py_DECREF(v);
        if (!idx) { if (!PyErr_Occurred()) fallback("op not in the schema's enum"); goto done; }
        if (put_long(&b, PyLong_AsLongLong(idx)) < 0) goto done;
        if (!(v = PyObject_GetAttr(c, S_txn))) goto done;
        rc = put_position(&b, v);
        Py_DECREF(v);
        if (rc < 0 || put_attr_int(&b, c, S_commit_ts) < 0) goto done;
        if (put_long(&b, refs[4 * i]) < 0) goto done;
        Py_ssize_t rows = refs[4 * i + 3];
        if (rows < 0) {
            if (put_long(&b, refs[4 * i + 1]) < 0 || put_long(&b, refs[4 * i + 2]) < 0) goto done;
            continue;
        }
        if (rows == 0) {  /* no row: no record (the header written above goes) */
            b.len = head;
            continue;
        }
        Py_ssize_t hlen = b.len - head;
        if (put_long(&b, -1) < 0 || put_long(&b, refs[4 * i + 2]) < 0) goto done;
        for (Py_ssize_t j = 1; j < rows; j++) {
            if (buf_grow(&b, hlen) < 0) goto done;
            memmove(b.p + b.len, b.p + head, (size_t)hlen);  /* (b.p may have moved: copy from it now) */
            b.len += hlen;
            if (put_long(&b, -1) < 0 || put_long(&b, refs[4 * i + 2] + j) < 0) goto done;
        }
    }
    if (put_long(&b, 0) < 0) goto done;

    /* images: one block per table with rows, column-wise */
    {
        Py_ssize_t nblocks = 0;
        for (Py_ssize_t i = 0; i < ts.n; i++) nblocks += ts.t[i].nrows > 0;
        if (nblocks && put_long(&b, nblocks) < 0) goto done;
        for (Py_ssize_t i = 0; i < ts.n; i++) {
            TableImages *t = &ts.t[i];
            if (!t->nrows) continue;
            PyObject *cols = PyObject_GetAttr(t->schema, S_columns);
            if (!cols) goto done;
            Py_ssize_t width = PyObject_Length(cols);
            Py_DECREF(cols);
            if (width < 0) goto done;
            for (Py_ssize_t r = 0; r < t->nrows; r++)
                if (PyTuple_GET_SIZE(t->rows[r]) != width) { fallback("row width differs from its schema"); goto done; }
            if (put_long(&b, i) < 0 || put_long(&b, t->nrows) < 0) goto done;
            if (width && put_long(&b, width) < 0) goto done;
            for (Py_ssize_t col = 0; col < width; col++)
                if (put_column(&b, t->rows, t->nrows, col) < 0) goto done;
            if (put_long(&b, 0) < 0) goto done;
        }
        if (put_long(&b, 0) < 0) goto done;
    }
    out = PyBytes_FromStringAndSize(b.p, b.len);
done:
    PyMem_Free(b.p);
    PyMem_Free(refs);
    tables_free(&ts);
    return out;
}

/* ======================================================================
 * decode_columns(payload, op_insert): the applier's compiled reader
 * (issue #12, applier side).  Twin of schemas/codec.py decode (fastavro),
 * for the common envelope: row INSERTs (or snapshot READs) only.  Instead of a Python object
 * per value it returns each image column in Arrow's memory layout (a
 * validity bitmap, fixed-width values or int32 offsets + data), which
 * cynomys/core/columnar.py wraps into pyarrow arrays without a copy, and
 * the records as runs of consecutive inserts (reads) of one transaction.  Anything
 * else (an UPDATE/DELETE/DDL record, a MixedColumn, malformed input) raises
 * Fallback: the caller then decodes the payload with the reference.
 * ====================================================================== */
typedef struct { const unsigned char *p, *end; } Rd;

static int rd_long(Rd *r, int64_t *out) {
    uint64_t z = 0;
    int shift = 0;
    for (;;) {
        if (r->p >= r->end) return fallback("truncated Avro");
        unsigned char c = *r->p++;
        z |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) break;
        shift += 7;
        if (shift > 63) return fallback("Avro varint too long");
    }
    *out = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
    return 0;
}

static int rd_raw(Rd *r, const char **s, Py_ssize_t *n) {
    int64_t len;
    if (rd_long(r, &len) < 0) return -1;
    if (len < 0 || len > r->end - r->p) return fallback("bad Avro length");
    *s = (const char *)r->p;
    *n = (Py_ssize_t)len;
    r->p += len;
    return 0;
}

static PyObject *rd_str(Rd *r) {
    const char *s;
    Py_ssize_t n;
    if (rd_raw(r, &s, &n) < 0) return NULL;
    PyObject *o = PyUnicode_DecodeUTF8(s, n, NULL);
    if (!o && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        fallback("string not UTF-8");
    }
    return o;
}

/* An array/map block count (a negative count is followed by its byte size). */
static int rd_block(Rd *r, int64_t *n) {
    if (rd_long(r, n) < 0) return -1;
    if (*n < 0) {
        int64_t size;
        *n = -*n;
        if (rd_long(r, &size) < 0) return -1;
    }
    return 0;
}

/* A Position record as (file, pos, gtid). */
static PyObject *rd_position(Rd *r) {
    PyObject *file = rd_str(r), *gtid = NULL;
    int64_t pos;
    if (!file) return NULL;
    if (rd_long(r, &pos) < 0 || !(gtid = rd_str(r))) { Py_DECREF(file); Py_XDECREF(gtid); return NULL; }
    PyObject *t = Py_BuildValue("(NLN)", file, (long long)pos, gtid);
    return t;
}

/* A string array (Avro blocks) appended to ``out``. */
static int rd_strings(Rd *r, PyObject *out) {
    int64_t m;
    for (;;) {
        if (rd_block(r, &m) < 0) return -1;
        if (m == 0) return 0;
        for (int64_t j = 0; j < m; j++) {
            PyObject *k = rd_str(r);
            if (!k || PyList_Append(out, k) < 0) { Py_XDECREF(k); return -1; }
            Py_DECREF(k);
        }
    }
}

/* The tables array: [(database, table, [(name, type, nullable)], [key], [[index column]])];
 * ``indexes``: the writer's version holds TableDef.indexes (v3), else each is []. */
static PyObject *rd_tables(Rd *r, int indexes) {
    PyObject *out = PyList_New(0);
    int64_t n;
    if (!out) return NULL;
    for (;;) {
        if (rd_block(r, &n) < 0) goto fail;
        if (n == 0) break;
        for (int64_t i = 0; i < n; i++) {
            PyObject *db = rd_str(r), *tb = db ? rd_str(r) : NULL, *cols = NULL, *keys = NULL, *idx = NULL, *t;
            if (!tb) { Py_XDECREF(db); goto fail; }
            cols = PyList_New(0);
            keys = PyList_New(0);
            idx = PyList_New(0);
            if (!cols || !keys || !idx) goto tfail;
            int64_t m;
            for (;;) {
                if (rd_block(r, &m) < 0) goto tfail;
                if (m == 0) break;
                for (int64_t j = 0; j < m; j++) {
                    PyObject *name = rd_str(r), *type = name ? rd_str(r) : NULL;
                    if (!type) { Py_XDECREF(name); goto tfail; }
                    if (r->p >= r->end) { Py_DECREF(name); Py_DECREF(type); fallback("truncated Avro"); goto tfail; }
                    PyObject *c = Py_BuildValue("(NNO)", name, type, *r->p++ ? Py_True : Py_False);
                    if (!c || PyList_Append(cols, c) < 0) { Py_XDECREF(c); goto tfail; }
                    Py_DECREF(c);
                }
            }
            if (rd_strings(r, keys) < 0) goto tfail;
            while (indexes) {
                if (rd_block(r, &m) < 0) goto tfail;
                if (m == 0) break;
                for (int64_t j = 0; j < m; j++) {
                    PyObject *one = PyList_New(0);
                    if (!one || rd_strings(r, one) < 0 || PyList_Append(idx, one) < 0) { Py_XDECREF(one); goto tfail; }
                    Py_DECREF(one);
                }
            }
            t = Py_BuildValue("(NNNNN)", db, tb, cols, keys, idx);
            if (!t || PyList_Append(out, t) < 0) { Py_XDECREF(t); goto fail; }
            Py_DECREF(t);
            continue;
        tfail:
            Py_DECREF(db); Py_DECREF(tb); Py_XDECREF(cols); Py_XDECREF(keys); Py_XDECREF(idx);
            goto fail;
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* The records array as runs: consecutive INSERT (or READ: snapshot rows)
 * records with the same header (tid .. table_ref, compared as raw bytes,
 * so one op per run), no before image and consecutive after images become
 * one run
 * (tid, database, table, (file, pos, gtid), commit_ts, table_ref, first_after, count, op). */
/* One whole record read from its start: (tid, database, table, txn, commit_ts,
 * table_ref, op, before, after, sql | None) -- a record that is not part of a
 * run of plain INSERT or READ images (an update, a delete, DDL). */
static PyObject *rd_record(const unsigned char *start, const unsigned char *end) {
    Rd h = {start, end};
    PyObject *tid = NULL, *db = NULL, *tb = NULL, *sql = NULL, *txn = NULL, *out = NULL;
    int64_t v, op, ts, ref, before, after;
    if (!(tid = rd_str(&h)) || !(db = rd_str(&h)) || !(tb = rd_str(&h))) goto done;
    if (rd_long(&h, &v) < 0) goto done;
    if (v == 1) {
        if (!(sql = rd_str(&h))) goto done;
    } else if (v == 0) {
        sql = Py_NewRef(Py_None);
    } else {
        fallback("bad union index");
        goto done;
    }
    if (rd_long(&h, &op) < 0 || !(txn = rd_position(&h))) goto done;
    if (rd_long(&h, &ts) < 0 || rd_long(&h, &ref) < 0 || rd_long(&h, &before) < 0 || rd_long(&h, &after) < 0)
        goto done;
    out = Py_BuildValue("(OOOOLLLLLO)", tid, db, tb, txn, (long long)ts, (long long)ref, (long long)op,
                        (long long)before, (long long)after, sql);
done:
    Py_XDECREF(tid); Py_XDECREF(db); Py_XDECREF(tb); Py_XDECREF(sql); Py_XDECREF(txn);
    return out;
}

/* The records as runs of plain INSERT/READ images (9-tuples); with ``all``
 * every other record as itself (a 10-tuple, rd_record) in its place, else
 * such a record makes the caller fall back to the reference reader. */
static PyObject *rd_runs(Rd *r, int64_t op_insert, int64_t op_read, int all) {
    PyObject *out = PyList_New(0);
    const unsigned char *head = NULL;   /* raw header of the open run */
    Py_ssize_t head_len = 0;
    int64_t first_after = 0, count = 0, next_after = 0;
    PyObject *tid = NULL, *db = NULL, *tb = NULL, *txn = NULL;
    int64_t commit_ts = 0, ref = 0, run_op = 0;
    if (!out) return NULL;
#define CLOSE_RUN() do { if (count) { \
        PyObject *t_ = Py_BuildValue("(OOOOLLLLL)", tid, db, tb, txn, (long long)commit_ts, (long long)ref, \
                                     (long long)first_after, (long long)count, (long long)run_op); \
        if (!t_ || PyList_Append(out, t_) < 0) { Py_XDECREF(t_); goto fail; } \
        Py_DECREF(t_); } \
        Py_CLEAR(tid); Py_CLEAR(db); Py_CLEAR(tb); Py_CLEAR(txn); count = 0; } while (0)
    for (;;) {
        int64_t n;
        if (rd_block(r, &n) < 0) goto fail;
        if (n == 0) break;
        for (int64_t i = 0; i < n; i++) {
            const unsigned char *start = r->p;
            const char *s;
            Py_ssize_t sn;
            int64_t v, op, ts, tref, before, after;
            /* tid, database_name, table_name: skipped for now, read again if a run starts here */
            for (int f = 0; f < 3; f++)
                if (rd_raw(r, &s, &sn) < 0) goto fail;
            if (rd_long(r, &v) < 0) goto fail;              /* sql: union index */
            int plain = v == 0;
            if (v == 1 && all) {
                if (rd_raw(r, &s, &sn) < 0) goto fail;
            } else if (v != 0) {
                fallback("a record with SQL text");
                goto fail;
            }
            if (rd_long(r, &op) < 0) goto fail;
            plain = plain && (op == op_insert || op == op_read);
            if (!plain && !all) { fallback("a record other than INSERT or READ"); goto fail; }
            if (rd_raw(r, &s, &sn) < 0 || rd_long(r, &v) < 0 || rd_raw(r, &s, &sn) < 0) goto fail;  /* txn */
            if (rd_long(r, &ts) < 0 || rd_long(r, &tref) < 0) goto fail;
            Py_ssize_t hlen = (Py_ssize_t)(r->p - start);
            if (rd_long(r, &before) < 0 || rd_long(r, &after) < 0) goto fail;
            if (plain && (tref < 0 || before != -1 || after < 0)) {
                if (!all) { fallback("a record without a plain insert image"); goto fail; }
                plain = 0;
            }
            if (!plain) {
                CLOSE_RUN();
                PyObject *rec = rd_record(start, r->end);
                if (!rec || PyList_Append(out, rec) < 0) { Py_XDECREF(rec); goto fail; }
                Py_DECREF(rec);
                continue;
            }
            if (count && hlen == head_len && memcmp(start, head, (size_t)hlen) == 0 && after == next_after) {
                count++;
                next_after++;
                continue;
            }
            CLOSE_RUN();
            Rd h = {start, r->end};
            if (!(tid = rd_str(&h)) || !(db = rd_str(&h)) || !(tb = rd_str(&h))) goto fail;
            if (rd_long(&h, &v) < 0 || rd_long(&h, &v) < 0) goto fail;
            if (!(txn = rd_position(&h))) goto fail;
            head = start;
            head_len = hlen;
            commit_ts = ts;
            ref = tref;
            run_op = op;
            first_after = after;
            next_after = after + 1;
            count = 1;
        }
    }
    CLOSE_RUN();
#undef CLOSE_RUN
    return out;
fail:
    Py_XDECREF(tid); Py_XDECREF(db); Py_XDECREF(tb); Py_XDECREF(txn);
    Py_DECREF(out);
    return NULL;
}

/* Column kinds of the image union, in the schema's order. */
enum { IK_LONG, IK_DOUBLE, IK_STRING, IK_BYTES, IK_DECIMAL, IK_BIGINT, IK_DATE, IK_DATETIME, IK_TIMESTAMP,
       IK_TIME, IK_MIXED };

/* One column of a block -> (kind, null_count, validity bytes | None, values | (offsets, data)). */
static PyObject *rd_column(Rd *r, int64_t rows) {
    int64_t kind, n;
    PyObject *validity = NULL, *values = NULL, *offsets = NULL, *out = NULL;
    Buf data = {0};
    int64_t nnull = 0, last = -1;
    if (rd_long(r, &kind) < 0) return NULL;
    if (kind < 0 || kind >= IK_MIXED) { fallback("a mixed column"); return NULL; }
    unsigned char *bits = NULL;
    for (;;) {
        if (rd_block(r, &n) < 0) goto done;
        if (n == 0) break;
        for (int64_t i = 0; i < n; i++) {
            int64_t idx;
            if (rd_long(r, &idx) < 0) goto done;
            if (idx <= last || idx >= rows) { fallback("NULL indexes out of order"); goto done; }
            last = idx;
            if (!validity) {
                validity = PyBytes_FromStringAndSize(NULL, (rows + 7) / 8);
                if (!validity) goto done;
                bits = (unsigned char *)PyBytes_AS_STRING(validity);
                memset(bits, 0xFF, (size_t)((rows + 7) / 8));
            }
            bits[idx >> 3] &= (unsigned char)~(1u << (idx & 7));
            nnull++;
        }
    }
    int fixed = kind == IK_LONG || kind == IK_DOUBLE || kind == IK_DATETIME || kind == IK_TIMESTAMP
                || kind == IK_TIME ? 8 : kind == IK_DATE ? 4 : 0;
    int32_t *offs = NULL;
    char *vals = NULL;
    if (fixed) {
        values = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(rows * fixed));
        if (!values) goto done;
        vals = PyBytes_AS_STRING(values);
        memset(vals, 0, (size_t)(rows * fixed));
    } else {
        offsets = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((rows + 1) * 4));
        if (!offsets) goto done;
        offs = (int32_t *)PyBytes_AS_STRING(offsets);
        offs[0] = 0;
    }
    int64_t row = 0;
#define IS_NULL(x) (bits && !(bits[(x) >> 3] & (1u << ((x) & 7))))
    for (;;) {
        if (rd_block(r, &n) < 0) goto done;
        if (n == 0) break;
        for (int64_t i = 0; i < n; i++) {
            while (row < rows && IS_NULL(row)) {
                if (offs) offs[row + 1] = (int32_t)data.len;
                row++;
            }
            if (row >= rows) { fallback("more values than rows"); goto done; }
            if (fixed == 8 && kind != IK_DOUBLE) {
                int64_t x;
                if (rd_long(r, &x) < 0) goto done;
                memcpy(vals + row * 8, &x, 8);
            } else if (kind == IK_DOUBLE) {
                if (r->end - r->p < 8) { fallback("truncated Avro"); goto done; }
                memcpy(vals + row * 8, r->p, 8);
                r->p += 8;
            } else if (fixed == 4) {
                int64_t x;
                if (rd_long(r, &x) < 0) goto done;
                if (x < INT32_MIN || x > INT32_MAX) { fallback("date out of range"); goto done; }
                int32_t d = (int32_t)x;
                memcpy(vals + row * 4, &d, 4);
            } else {
                const char *s;
                Py_ssize_t sn;
                if (rd_raw(r, &s, &sn) < 0) goto done;
                if (data.len + sn > INT32_MAX) { fallback("column too large for int32 offsets"); goto done; }
                if (sn) {  /* plain bytes: put_raw would write Avro's length prefix */
                    if (buf_grow(&data, sn) < 0) goto done;
                    memcpy(data.p + data.len, s, (size_t)sn);
                    data.len += sn;
                }
                offs[row + 1] = (int32_t)data.len;
            }
            row++;
        }
    }
    while (row < rows && IS_NULL(row)) {
        if (offs) offs[row + 1] = (int32_t)data.len;
        row++;
    }
#undef IS_NULL
    if (row != rows) { fallback("fewer values than rows"); goto done; }
    if (!fixed) {
        PyObject *d = PyBytes_FromStringAndSize(data.p ? data.p : "", data.len);
        if (!d) goto done;
        values = Py_BuildValue("(ON)", offsets, d);
        if (!values) goto done;
    }
    out = Py_BuildValue("(LLOO)", (long long)kind, (long long)nnull, validity ? validity : Py_None, values);
done:
    PyMem_Free(data.p);
    Py_XDECREF(validity);
    Py_XDECREF(values);
    Py_XDECREF(offsets);
    return out;
}

/* images: [(table_ref, rows, [column])] */
static PyObject *rd_images(Rd *r) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (;;) {
        int64_t n;
        if (rd_block(r, &n) < 0) goto fail;
        if (n == 0) break;
        for (int64_t i = 0; i < n; i++) {
            int64_t ref, rows, m;
            if (rd_long(r, &ref) < 0 || rd_long(r, &rows) < 0) goto fail;
            if (rows < 0 || rows > INT32_MAX) { fallback("bad row count"); goto fail; }
            PyObject *cols = PyList_New(0);
            if (!cols) goto fail;
            for (;;) {
                if (rd_block(r, &m) < 0) { Py_DECREF(cols); goto fail; }
                if (m == 0) break;
                for (int64_t j = 0; j < m; j++) {
                    PyObject *c = rd_column(r, rows);
                    if (!c || PyList_Append(cols, c) < 0) { Py_XDECREF(c); Py_DECREF(cols); goto fail; }
                    Py_DECREF(c);
                }
            }
            PyObject *t = Py_BuildValue("(LLN)", (long long)ref, (long long)rows, cols);
            if (!t || PyList_Append(out, t) < 0) { Py_XDECREF(t); goto fail; }
            Py_DECREF(t);
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* decode_columns(payload: bytes-like (the Avro after MAGIC+version), op_insert: int, op_read: int = -1,
 *                all: int = 0, indexes: int = 0)
 *   -> (producer_id, end, complete, first_txn | None, created_us, last_commit_ts, meta, tables, runs, images)
 * ``runs``: runs of plain INSERT/READ images; with ``all``, other records
 * among them in stream order (rd_runs). */
static PyObject *decode_columns(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long op_insert, op_read = -1;
    int all = 0, indexes = 0;
    PyObject *producer = NULL, *end = NULL, *first = NULL, *meta = NULL, *tables = NULL, *runs = NULL,
             *images = NULL, *out = NULL;
    if (!PyArg_ParseTuple(args, "y*L|Lpp:decode_columns", &view, &op_insert, &op_read, &all, &indexes)) return NULL;
    Rd r = {(const unsigned char *)view.buf, (const unsigned char *)view.buf + view.len};
    int64_t v, created, last_ts;
    int complete;
    if (!(producer = rd_str(&r)) || !(end = rd_position(&r))) goto done;
    if (r.p >= r.end) { fallback("truncated Avro"); goto done; }
    complete = *r.p++ != 0;
    if (rd_long(&r, &v) < 0) goto done;
    if (v == 1) {
        if (!(first = rd_position(&r))) goto done;
    } else if (v == 0) {
        first = Py_NewRef(Py_None);
    } else {
        fallback("bad union index");
        goto done;
    }
    if (rd_long(&r, &created) < 0 || rd_long(&r, &last_ts) < 0) goto done;
    if (!(meta = PyDict_New())) goto done;
    for (;;) {
        int64_t n;
        if (rd_block(&r, &n) < 0) goto done;
        if (n == 0) break;
        for (int64_t i = 0; i < n; i++) {
            PyObject *k = rd_str(&r), *val = k ? rd_str(&r) : NULL;
            int rc = val ? PyDict_SetItem(meta, k, val) : -1;
            Py_XDECREF(k);
            Py_XDECREF(val);
            if (rc < 0) goto done;
        }
    }
    if (!(tables = rd_tables(&r, indexes)) || !(runs = rd_runs(&r, op_insert, op_read, all)) || !(images = rd_images(&r))) goto done;
    out = Py_BuildValue("(OOOOLLOOOO)", producer, end, complete ? Py_True : Py_False, first, (long long)created,
                        (long long)last_ts, meta, tables, runs, images);
done:
    PyBuffer_Release(&view);
    Py_XDECREF(producer); Py_XDECREF(end); Py_XDECREF(first); Py_XDECREF(meta);
    Py_XDECREF(tables); Py_XDECREF(runs); Py_XDECREF(images);
    return out;
}

/* TextConverter(kind, reference): a converter for the snapshot driver
 * (mysqlclient calls it with each field's text): kind 0 DECIMAL, 1 DATE,
 * 2 DATETIME/TIMESTAMP.  Equal texts give the same object from a small
 * direct-mapped cache (prices, quantities, dates repeat), so the chunk rows
 * allocate less and the Avro writer's str(Decimal) cache (by identity)
 * hits; a date or datetime in the server's own form is parsed here, any
 * other text (zero dates, bytes, other forms) goes to ``reference``, the
 * Python converter this replaces (snapshot/source.py), which stays the
 * specification: the values are the same (tests/unit/test_text_converter.py). */
typedef struct {
    PyObject_HEAD
    int kind;
    PyObject *reference;
    SSlot cache[SCACHE];
} TextConverter;

static int digits(const char *s, int n, int *out) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 1;
}

/* "YYYY-MM-DD" as a date, "YYYY-MM-DD HH:MM:SS[.f{1,6}]" as a datetime
 * (what datetime.fromisoformat gives for them); NULL without an error when
 * the text is anything else (the reference decides). */
static PyObject *parse_temporal(int kind, const char *s, Py_ssize_t len) {
    int y, m, d, H = 0, M = 0, S = 0, us = 0;
    if (len < 10 || s[4] != '-' || s[7] != '-' || !digits(s, 4, &y) || !digits(s + 5, 2, &m)
        || !digits(s + 8, 2, &d) || !valid_date(y, m, d))
        return NULL;
    if (kind == 1)
        return len == 10 ? PyDate_FromDate(y, m, d) : NULL;
    if (len < 19 || s[10] != ' ' || s[13] != ':' || s[16] != ':' || !digits(s + 11, 2, &H)
        || !digits(s + 14, 2, &M) || !digits(s + 17, 2, &S) || H > 23 || M > 59 || S > 59)
        return NULL;
    if (len > 19) {
        int nf = (int)len - 20;
        if (s[19] != '.' || nf < 1 || nf > 6 || !digits(s + 20, nf, &us)) return NULL;
        us *= (int)POW10[6 - nf];
    }
    return PyDateTime_FromDateAndTime(y, m, d, H, M, S, us);
}

static PyTypeObject TextConverterType;

/* A DOUBLE's text as float() reads it; NULL without an error when the text
 * is anything else (spaces, underscores: the reference decides).  The
 * text is NUL-terminated (a bytes object's or a str's UTF-8). */
static PyObject *parse_double(const char *s, Py_ssize_t len) {
    char *end = NULL;
    if (len == 0 || len > 64) return NULL;
    double d = PyOS_string_to_double(s, &end, NULL);
    if (d == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return NULL; }
    if (end != s + len) return NULL;
    return PyFloat_FromDouble(d);
}

/* One field's text (``len`` bytes at ``s``) as its value: from the cache,
 * parsed here, or from ``reference`` called with ``arg`` (the field's str;
 * NULL: made from the text, as mysqlclient makes it). */
static PyObject *tc_convert(TextConverter *self, const char *s, Py_ssize_t len, PyObject *arg) {
    SSlot *slot = NULL;
    PyObject *v;
    if (self->kind != 3 && len <= SCACHE_MAXLEN) {
        slot = sslot(self->cache, s, len);
        if ((v = sslot_hit(slot, s, len))) return v;
    }
    v = self->kind == 0 ? NULL : self->kind == 3 ? parse_double(s, len) : parse_temporal(self->kind, s, len);
    if (!v && !PyErr_Occurred()) {
        PyObject *text = arg ? Py_NewRef(arg) : PyUnicode_DecodeUTF8(s, len, NULL);
        if (!text) return NULL;
        v = PyObject_CallOneArg(self->reference, text);
        Py_DECREF(text);
    }
    if (v && slot) sslot_keep(slot, s, len, v);
    return v;
}

static PyObject *TextConverter_call(TextConverter *self, PyObject *args, PyObject *kw) {
    PyObject *arg;
    if (!PyArg_UnpackTuple(args, "TextConverter", 1, 1, &arg)) return NULL;
    if (!PyUnicode_CheckExact(arg) || !PyUnicode_IS_ASCII(arg))
        return PyObject_CallOneArg(self->reference, arg);
    return tc_convert(self, (const char *)PyUnicode_DATA(arg), PyUnicode_GET_LENGTH(arg), arg);
}

/* convert_fields(rows, plan) -> list: the rows a snapshot chunk select
 * fetched with the plan's fields left as the server's text (bytes: the
 * driver's converter for their type is None, its fast path), each such
 * field made its value by its converter -- plan is ((index, TextConverter),
 * ...).  What mysqlclient does calling the converter once per field (a str
 * and an argument tuple made, a Python call: ~300 ns a field, two thirds of
 * the chunk readers' fetch on lineitem), in one pass.  A row only the
 * fetched sequence holds is changed in place, any other is copied; None
 * stays None; a str goes through the converter's call; anything else is
 * left as it is (already a value). */
static PyObject *convert_fields(PyObject *self, PyObject *args) {
    PyObject *rows, *plan;
    if (!PyArg_ParseTuple(args, "OO!:convert_fields", &rows, &PyTuple_Type, &plan)) return NULL;
    Py_ssize_t np = PyTuple_GET_SIZE(plan);
    Py_ssize_t *idx = PyMem_Malloc((size_t)(np ? np : 1) * sizeof(Py_ssize_t));
    TextConverter **tcs = PyMem_Malloc((size_t)(np ? np : 1) * sizeof(TextConverter *));
    PyObject *seq = NULL, *out = NULL;
    if (!idx || !tcs) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t j = 0; j < np; j++) {
        PyObject *p = PyTuple_GET_ITEM(plan, j);
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 2 || !PyLong_Check(PyTuple_GET_ITEM(p, 0))
            || !PyObject_TypeCheck(PyTuple_GET_ITEM(p, 1), &TextConverterType)) {
            PyErr_SetString(PyExc_TypeError, "plan is a tuple of (index, TextConverter)");
            goto done;
        }
        idx[j] = PyLong_AsSsize_t(PyTuple_GET_ITEM(p, 0));
        if (idx[j] < 0) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "negative field index"); goto done; }
        tcs[j] = (TextConverter *)PyTuple_GET_ITEM(p, 1);
    }
    if (!(seq = PySequence_Fast(rows, "rows is a sequence of tuples"))) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (!(out = PyList_New(n))) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_CheckExact(row)) { PyErr_SetString(PyExc_TypeError, "a fetched row is not a tuple"); goto fail; }
        Py_ssize_t w = PyTuple_GET_SIZE(row);
        /* Held by the fetched sequence alone (and ``seq`` is that sequence): nobody else sees it change. */
        int mine = Py_REFCNT(row) == 1 && seq == rows;
        if (!mine) {
            PyObject *copy = PyTuple_New(w);
            if (!copy) goto fail;
            for (Py_ssize_t k = 0; k < w; k++) PyTuple_SET_ITEM(copy, k, Py_NewRef(PyTuple_GET_ITEM(row, k)));
            row = copy;
        } else {
            Py_INCREF(row);
        }
        PyList_SET_ITEM(out, i, row);
        for (Py_ssize_t j = 0; j < np; j++) {
            if (idx[j] >= w) { PyErr_SetString(PyExc_IndexError, "a plan field is past the row's end"); goto fail; }
            PyObject *v = PyTuple_GET_ITEM(row, idx[j]), *c;
            if (PyBytes_CheckExact(v))
                c = tc_convert(tcs[j], PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v), NULL);
            else if (PyUnicode_CheckExact(v))
                c = PyObject_CallOneArg((PyObject *)tcs[j], v);
            else
                continue;
            if (!c) goto fail;
            PyTuple_SET_ITEM(row, idx[j], c);
            Py_DECREF(v);
        }
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(seq);
    PyMem_Free(idx);
    PyMem_Free(tcs);
    return out;
}

static PyObject *TextConverter_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    int kind;
    PyObject *reference;
    if (!PyArg_ParseTuple(args, "iO:TextConverter", &kind, &reference)) return NULL;
    if (kind < 0 || kind > 3) {
        PyErr_SetString(PyExc_ValueError, "kind is 0 (DECIMAL), 1 (DATE), 2 (DATETIME) or 3 (DOUBLE)");
        return NULL;
    }
    TextConverter *self = (TextConverter *)type->tp_alloc(type, 0);  /* zeroed: an empty cache */
    if (!self) return NULL;
    self->kind = kind;
    Py_INCREF(reference);
    self->reference = reference;
    return (PyObject *)self;
}

static void TextConverter_dealloc(TextConverter *self) {
    for (int i = 0; i < SCACHE; i++) Py_XDECREF(self->cache[i].v);
    Py_XDECREF(self->reference);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject TextConverterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cynomys._speedups.TextConverter",
    .tp_basicsize = sizeof(TextConverter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TextConverter(kind, reference): a cached snapshot-driver converter (see _speedups.c)",
    .tp_new = TextConverter_new,
    .tp_call = (ternaryfunc)TextConverter_call,
    .tp_dealloc = (destructor)TextConverter_dealloc,
};

/* ====================================================================
 * LOAD DATA text of Arrow columns (applier/targets/columnstore/loaddata.py)
 *
 * load_data_lines(n, columns) -> bytes: n rows as MariaDB LOAD DATA lines
 * (fields tab-separated, lines '\n'-terminated, NULL as \N), the same bytes
 * as loaddata._lines writes with pyarrow's kernels for these column modes
 * (the tests compare them).  A column is (mode, offset, validity, data,
 * offsets): Arrow buffers (anything with the buffer protocol, or None) of an
 * array starting at row ``offset``.  Modes:
 *   0 int64 as decimal text          1 the same, at least 4 digits (YEAR)
 *   2 text, backslash, tab and newline escaped with a backslash
 *   3 DECIMAL text as it is, one in str(Decimal)'s exponent form as
 *     format(Decimal, 'f') writes it (ld_plain_decimal)
 *   4 text as it is (big integers)
 *   5 int32 days since 1970-01-01 as YYYY-MM-DD
 *   6 int64 microseconds since 1970-01-01 as YYYY-MM-DD HH:MM:SS.ffffff
 * A date outside years 1-9999 raises Fallback (the caller writes the piece
 * with pyarrow).
 * ==================================================================== */

typedef struct {
    int mode;
    Py_ssize_t offset;
    Py_buffer valid, data, offs;   /* .obj NULL: not given */
} LDCol;

static void ld_release(LDCol *cols, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (cols[i].valid.obj) PyBuffer_Release(&cols[i].valid);
        if (cols[i].data.obj) PyBuffer_Release(&cols[i].data);
        if (cols[i].offs.obj) PyBuffer_Release(&cols[i].offs);
    }
}

static int ld_buffer(PyObject *o, Py_buffer *view) {
    view->obj = NULL;
    if (o == Py_None) return 0;
    return PyObject_GetBuffer(o, view, PyBUF_SIMPLE);
}

static inline char *ld_digits(char *o, uint64_t v, int width) {
    char t[24];
    int n = 0;
    do { t[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (n < width) t[n++] = '0';
    while (n) *o++ = t[--n];
    return o;
}

/* Days since 1970-01-01 that Python's date holds: 0001-01-01 .. 9999-12-31. */
#define PY_DAYS_OK(days) ((days) >= -719162 && (days) <= 2932896)

/* Microseconds since 1970-01-01 as whole days and the microseconds into the last. */
static inline void split_us(int64_t us, int64_t *days, int64_t *rem) {
    *days = us / 86400000000LL;
    *rem = us % 86400000000LL;
    if (*rem < 0) { *rem += 86400000000LL; *days -= 1; }
}

/* YYYY-MM-DD, as date.isoformat() writes it. */
static char *ld_ymd(char *o, int y, int m, int d) {
    o = ld_digits(o, (uint64_t)y, 4); *o++ = '-';
    o = ld_digits(o, (uint64_t)m, 2); *o++ = '-';
    return ld_digits(o, (uint64_t)d, 2);
}

/* HH:MM:SS.ffffff of the microseconds into a day. */
static char *ld_hms(char *o, int64_t day_us) {
    int64_t secs = day_us / 1000000;
    o = ld_digits(o, (uint64_t)(secs / 3600), 2); *o++ = ':';
    o = ld_digits(o, (uint64_t)(secs / 60 % 60), 2); *o++ = ':';
    o = ld_digits(o, (uint64_t)(secs % 60), 2); *o++ = '.';
    return ld_digits(o, (uint64_t)(day_us % 1000000), 6);
}

/* Backslash, tab and newline escaped with a backslash (FIELDS ESCAPED BY '\\'). */
static inline char *ld_escape(char *o, const char *s, Py_ssize_t len) {
    for (Py_ssize_t j = 0; j < len; j++) {
        char ch = s[j];
        if (ch == '\\' || ch == '\t' || ch == '\n') {
            *o++ = '\\';
            *o++ = ch == '\t' ? 't' : ch == '\n' ? 'n' : '\\';
        } else *o++ = ch;
    }
    return o;
}

static char *ld_date(char *o, int64_t days) {
    if (!PY_DAYS_OK(days)) return NULL;
    int y, m, d;
    civil_from_days(days, &y, &m, &d);
    return ld_ymd(o, y, m, d);
}


/* str(Decimal)'s exponent form ('1.0E-9', '-0E-10') as format(Decimal,
 * 'f') writes it ('0.0000000010', '-0.0000000000'): the coefficient's digits
 * with the point moved, never rounded.  NULL for a positive exponent or more
 * than LD_DECIMAL_FRACTION digits after the point (not from a DECIMAL
 * column, whose scale is at most 30: the caller leaves it to Python), so the
 * text grows by at most LD_DECIMAL_FRACTION + 3 bytes (the caller's bound). */
#define LD_DECIMAL_FRACTION 66
static char *ld_plain_decimal(char *o, const char *s, Py_ssize_t len) {
    Py_ssize_t i = 0, nd = 0, frac = 0;
    char digits[128];
    int point = 0;
    if (i < len && (s[i] == '-' || s[i] == '+')) i++;
    for (; i < len && s[i] != 'E'; i++) {
        if (s[i] == '.') { point = 1; continue; }
        if (s[i] < '0' || s[i] > '9' || nd >= (Py_ssize_t)sizeof(digits)) return NULL;
        digits[nd++] = s[i];
        frac += point;
    }
    if (i + 2 >= len || nd == 0 || s[i + 1] != '-') return NULL;
    Py_ssize_t e = 0;
    for (Py_ssize_t j = i + 2; j < len; j++) {
        if (s[j] < '0' || s[j] > '9' || e > 1000) return NULL;
        e = e * 10 + (s[j] - '0');
    }
    Py_ssize_t x = e + frac;  /* digits after the point */
    if (x > LD_DECIMAL_FRACTION) return NULL;
    if (s[0] == '-') *o++ = '-';
    if (nd > x) {
        memcpy(o, digits, (size_t)(nd - x)); o += nd - x;
        *o++ = '.';
        memcpy(o, digits + nd - x, (size_t)x); o += x;
    } else {
        *o++ = '0'; *o++ = '.';
        memset(o, '0', (size_t)(x - nd)); o += x - nd;
        memcpy(o, digits, (size_t)nd); o += nd;
    }
    return o;
}

static PyObject *load_data_lines(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    PyObject *columns;
    if (!PyArg_ParseTuple(args, "nO!", &n, &PyList_Type, &columns)) return NULL;
    Py_ssize_t ncol = PyList_GET_SIZE(columns);
    if (n < 0 || ncol < 1) { PyErr_SetString(PyExc_ValueError, "rows >= 0 and at least one column"); return NULL; }
    LDCol *cols = PyMem_Calloc((size_t)ncol, sizeof(LDCol));
    if (!cols) return PyErr_NoMemory();
    PyObject *out = NULL;
    Py_ssize_t got = 0;
    /* An upper bound of the text: per row a tab or newline per column, and
     * per value its widest text (or \N). */
    Py_ssize_t cap = 0;
    for (; got < ncol; got++) {
        PyObject *t = PyList_GET_ITEM(columns, got), *valid, *data, *offs;
        LDCol *c = &cols[got];
        if (!PyArg_ParseTuple(t, "inOOO", &c->mode, &c->offset, &valid, &data, &offs)) goto done;
        if (ld_buffer(valid, &c->valid) < 0 || ld_buffer(data, &c->data) < 0 || ld_buffer(offs, &c->offs) < 0)
            goto done;
        if (c->mode < 0 || c->mode > 6 || c->offset < 0) { PyErr_SetString(PyExc_ValueError, "bad column"); goto done; }
        Py_ssize_t end = c->offset + n;
        if (c->valid.obj && c->valid.len * 8 < end) { PyErr_SetString(PyExc_ValueError, "validity too short"); goto done; }
        if (c->mode >= 2 && c->mode <= 4) {
            if (!c->offs.obj || c->offs.len < (end + 1) * 4) { PyErr_SetString(PyExc_ValueError, "offsets too short"); goto done; }
            const int32_t *of = (const int32_t *)c->offs.buf;
            Py_ssize_t span = n ? of[end] - of[c->offset] : 0;
            if (n && (of[c->offset] < 0 || span < 0 || of[end] > (c->data.obj ? c->data.len : 0))) {
                PyErr_SetString(PyExc_ValueError, "offsets outside the data"); goto done;
            }
            /* escapes double a text; a plain DECIMAL grows (ld_plain_decimal) */
            cap += (c->mode == 2 ? 2 * span : span) + (c->mode == 3 ? LD_DECIMAL_FRACTION + 5 : 2) * n;
        } else {
            int width = c->mode == 5 ? 4 : 8;
            if (!c->data.obj || c->data.len < end * width) { PyErr_SetString(PyExc_ValueError, "data too short"); goto done; }
            cap += n * (c->mode == 6 ? 26 : 20);
        }
        cap += n;  /* the tab or newline */
    }
    out = PyBytes_FromStringAndSize(NULL, cap);
    if (!out) goto done;
    char *o = PyBytes_AS_STRING(out), *start = o;
    const char *why = NULL;
    /* The buffers are held and the bytes object is not shared yet: the
     * text is written without the GIL (the applier's open stage runs
     * meanwhile, applier/opening.py). */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < n; r++) {
        for (Py_ssize_t k = 0; k < ncol; k++) {
            LDCol *c = &cols[k];
            Py_ssize_t i = c->offset + r;
            if (c->valid.obj && !((((const unsigned char *)c->valid.buf)[i >> 3] >> (i & 7)) & 1)) {
                *o++ = '\\'; *o++ = 'N';
            } else switch (c->mode) {
            case 0: case 1: {
                int64_t v = ((const int64_t *)c->data.buf)[i];
                uint64_t u = (uint64_t)v;
                if (v < 0) {
                    /* (pyarrow pads a YEAR's text, sign and all: never met) */
                    if (c->mode == 1) { why = "a negative YEAR"; goto stop; }
                    *o++ = '-';
                    u = 0 - u;
                }
                o = ld_digits(o, u, c->mode == 1 ? 4 : 1);
                break;
            }
            case 2: case 3: case 4: {
                const int32_t *of = (const int32_t *)c->offs.buf;
                const char *s = (const char *)c->data.buf + of[i];
                Py_ssize_t len = of[i + 1] - of[i];
                if (c->mode == 2) {
                    o = ld_escape(o, s, len);
                } else {
                    if (c->mode == 3 && len && memchr(s, 'E', (size_t)len)) {
                        o = ld_plain_decimal(o, s, len);
                        if (!o) { why = "a DECIMAL text in an exponent form left to Python"; goto stop; }
                        break;
                    }
                    memcpy(o, s, (size_t)len);
                    o += len;
                }
                break;
            }
            case 5:
                o = ld_date(o, ((const int32_t *)c->data.buf)[i]);
                if (!o) { why = "a date outside years 1-9999"; goto stop; }
                break;
            case 6: {
                int64_t days, rem;
                split_us(((const int64_t *)c->data.buf)[i], &days, &rem);
                o = ld_date(o, days);
                if (!o) { why = "a datetime outside years 1-9999"; goto stop; }
                *o++ = ' ';
                o = ld_hms(o, rem);
                break;
            }
            }
            *o++ = k + 1 < ncol ? '\t' : '\n';
        }
    }
stop:
    Py_END_ALLOW_THREADS
    if (why) { PyErr_SetString(Fallback, why); goto fail; }
    if (_PyBytes_Resize(&out, o - start) < 0) out = NULL;
    goto done;
fail:
    Py_CLEAR(out);
done:
    ld_release(cols, got < ncol ? got + 1 : ncol);
    PyMem_Free(cols);
    return out;
}

/* ====================================================================
 * Python values of an Arrow column of wire values (core/columnar.py)
 *
 * column_values(kind, offset, count, validity, data, offsets) -> list: the
 * values ColumnBlock.python_values makes with pyarrow's to_pylist and the
 * codec's conversions (codec._READ_COLUMN), None for a NULL.  kind is the
 * index in core.columnar.KINDS:
 *   0 int64 -> int        1 float64 -> float   2 UTF-8 -> str  3 bytes
 *   4 text -> Decimal     5 text -> int         6 int32 days -> date
 *   7 int64 us -> naive datetime   8 int64 us -> datetime in UTC
 *   9 int64 us -> timedelta
 * A date outside years 1-9999 raises Fallback (the reference raises its
 * OverflowError).  Updates and deletes need their row images as Python
 * values: pyarrow's to_pylist and a Python call per value were most of the
 * applier's CPU on a large UPDATE.
 * ==================================================================== */
static PyObject *column_value(int kind, const char *data, const int32_t *of, Py_ssize_t i) {
    switch (kind) {
    case 0: return PyLong_FromLongLong(((const int64_t *)data)[i]);
    case 1: return PyFloat_FromDouble(((const double *)data)[i]);
    case 2: return PyUnicode_DecodeUTF8(data + of[i], of[i + 1] - of[i], NULL);
    case 3: return PyBytes_FromStringAndSize(data + of[i], of[i + 1] - of[i]);
    case 4: case 5: {
        PyObject *t = PyUnicode_DecodeUTF8(data + of[i], of[i + 1] - of[i], NULL);
        if (!t) return NULL;
        PyObject *v = kind == 4 ? PyObject_CallOneArg(DecimalType, t) : PyLong_FromUnicodeObject(t, 10);
        Py_DECREF(t);
        return v;
    }
    case 6: {
        int64_t days = ((const int32_t *)data)[i];
        if (!PY_DAYS_OK(days)) { PyErr_SetString(Fallback, "a date outside years 1-9999"); return NULL; }
        int y, m, d;
        civil_from_days(days, &y, &m, &d);
        return PyDate_FromDate(y, m, d);
    }
    case 7: case 8: {
        int64_t days, rem;
        split_us(((const int64_t *)data)[i], &days, &rem);
        if (!PY_DAYS_OK(days)) { PyErr_SetString(Fallback, "a datetime outside years 1-9999"); return NULL; }
        int y, m, d;
        civil_from_days(days, &y, &m, &d);
        int64_t secs = rem / 1000000;
        return PyDateTimeAPI->DateTime_FromDateAndTime(y, m, d, (int)(secs / 3600), (int)(secs / 60 % 60),
                                                       (int)(secs % 60), (int)(rem % 1000000),
                                                       kind == 8 ? PyDateTime_TimeZone_UTC : Py_None,
                                                       PyDateTimeAPI->DateTimeType);
    }
    case 9: {
        int64_t days, rem;
        split_us(((const int64_t *)data)[i], &days, &rem);
        if (days > 999999999 || days < -999999999) { PyErr_SetString(Fallback, "a time beyond timedelta"); return NULL; }
        return PyDelta_FromDSU((int)days, (int)(rem / 1000000), (int)(rem % 1000000));
    }
    }
    PyErr_SetString(PyExc_ValueError, "unknown column kind");
    return NULL;
}

static PyObject *column_values(PyObject *self, PyObject *args) {
    int kind;
    Py_ssize_t offset, count;
    PyObject *valid_o, *data_o, *offs_o;
    if (!PyArg_ParseTuple(args, "innOOO", &kind, &offset, &count, &valid_o, &data_o, &offs_o)) return NULL;
    if (kind < 0 || kind > 9 || offset < 0 || count < 0) { PyErr_SetString(PyExc_ValueError, "bad column"); return NULL; }
    Py_buffer valid, data, offs;
    PyObject *out = NULL;
    if (ld_buffer(valid_o, &valid) < 0) return NULL;
    if (ld_buffer(data_o, &data) < 0) goto release_valid;
    if (ld_buffer(offs_o, &offs) < 0) goto release_data;
    Py_ssize_t end = offset + count;
    int text = kind >= 2 && kind <= 5;
    int width = kind == 6 ? 4 : 8;
    if (valid.obj && valid.len * 8 < end) { PyErr_SetString(PyExc_ValueError, "validity too short"); goto release; }
    if (text) {
        if (!offs.obj || offs.len < (end + 1) * 4) { PyErr_SetString(PyExc_ValueError, "offsets too short"); goto release; }
        const int32_t *of = (const int32_t *)offs.buf;
        Py_ssize_t dlen = data.obj ? data.len : 0;
        for (Py_ssize_t i = offset; i < end; i++)
            if (of[i] < 0 || of[i + 1] < of[i] || of[i + 1] > dlen) {
                PyErr_SetString(PyExc_ValueError, "offsets outside the data"); goto release;
            }
    } else if (count && (!data.obj || data.len < end * width)) {
        PyErr_SetString(PyExc_ValueError, "data too short"); goto release;
    }
    out = PyList_New(count);
    if (!out) goto release;
    for (Py_ssize_t r = 0; r < count; r++) {
        Py_ssize_t i = offset + r;
        PyObject *v;
        if (valid.obj && !((((const unsigned char *)valid.buf)[i >> 3] >> (i & 7)) & 1)) {
            v = Py_NewRef(Py_None);
        } else {
            v = column_value(kind, data.obj ? (const char *)data.buf : "", text ? (const int32_t *)offs.buf : NULL, i);
            if (!v) { Py_CLEAR(out); goto release; }
        }
        PyList_SET_ITEM(out, r, v);
    }
release:
    if (offs.obj) PyBuffer_Release(&offs);
release_data:
    if (data.obj) PyBuffer_Release(&data);
release_valid:
    if (valid.obj) PyBuffer_Release(&valid);
    return out;
}

/* ====================================================================
 * LOAD DATA text of Python rows (ColumnStoreTarget.write_load_data)
 *
 * load_data_rows(rows, encoders, generic) -> bytes: the rows
 * (tuples of model values) as LOAD DATA lines, the bytes the reference loop
 * writes: b"\t".join(enc(v) for enc, v in zip(encoders, row)) + b"\n" per
 * row.  A column whose encoder is ``generic`` (types.encode_field) has the
 * common exact types written here -- None, int within int64, str, bytes,
 * Decimal (format(v, 'f'), asked of the object), date, naive datetime --
 * and every other value (bool, float, RawTemporal, an aware datetime, a
 * timedelta, ...) given to the encoder; any other column's values all go
 * to its encoder (e.g. YEAR's).  Rows of updates and deletes come this way
 * (row images, not columns): the reference's per-value Python was about a
 * third of the applier's CPU on a large UPDATE.
 * ==================================================================== */

static inline int ld_put(Buf *b, const char *s, Py_ssize_t n, int escape) {
    if (buf_grow(b, escape ? 2 * n : n) < 0) return -1;
    char *o = b->p + b->len;
    if (!escape) { memcpy(o, s, (size_t)n); b->len += n; return 0; }
    b->len = ld_escape(o, s, n) - b->p;
    return 0;
}

/* The column's encoder's bytes for v (what the reference writes). */
static int ld_encoded(Buf *b, PyObject *enc, PyObject *v) {
    PyObject *r = PyObject_CallOneArg(enc, v);
    if (!r) return -1;
    if (!PyBytes_Check(r)) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "a LOAD DATA field encoder returned something other than bytes");
        return -1;
    }
    int rc = ld_put(b, PyBytes_AS_STRING(r), PyBytes_GET_SIZE(r), 0);
    Py_DECREF(r);
    return rc;
}

/* One value of a generic column: 1 written, 0 left to the encoder, -1 error. */
static int ld_value(Buf *b, PyObject *v) {
    if (v == Py_None) return ld_put(b, "\\N", 2, 0) < 0 ? -1 : 1;
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyLong_Type) {
        int overflow;
        long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (n == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
        if (buf_grow(b, 21) < 0) return -1;
        char *o = b->p + b->len;
        uint64_t u = (uint64_t)n;
        if (n < 0) { *o++ = '-'; u = 0 - u; }
        b->len = ld_digits(o, u, 1) - b->p;
        return 1;
    }
    if (t == &PyUnicode_Type) {
        Py_ssize_t n;
        const char *u = PyUnicode_AsUTF8AndSize(v, &n);
        if (!u) { PyErr_Clear(); return 0; }  /* a lone surrogate: the encoder raises as it does */
        return ld_put(b, u, n, 1) < 0 ? -1 : 1;
    }
    if (t == &PyBytes_Type) return ld_put(b, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v), 1) < 0 ? -1 : 1;
    if ((PyObject *)t == DecimalType) {
        PyObject *s = PyObject_Format(v, S_f);
        if (!s) return -1;
        Py_ssize_t n;
        const char *u = PyUnicode_AsUTF8AndSize(s, &n);
        int rc = u ? (ld_put(b, u, n, 1) < 0 ? -1 : 1) : -1;
        Py_DECREF(s);
        return rc;
    }
    if (PyDate_CheckExact(v)) {
        if (buf_grow(b, 10) < 0) return -1;
        b->len = ld_ymd(b->p + b->len, PyDateTime_GET_YEAR(v), PyDateTime_GET_MONTH(v), PyDateTime_GET_DAY(v)) - b->p;
        return 1;
    }
    if (PyDateTime_CheckExact(v) && ((PyDateTime_DateTime *)v)->hastzinfo == 0) {
        if (buf_grow(b, 26) < 0) return -1;
        char *o = ld_ymd(b->p + b->len, PyDateTime_GET_YEAR(v), PyDateTime_GET_MONTH(v), PyDateTime_GET_DAY(v));
        *o++ = ' ';
        int64_t secs = (PyDateTime_DATE_GET_HOUR(v) * 60 + PyDateTime_DATE_GET_MINUTE(v)) * 60 + PyDateTime_DATE_GET_SECOND(v);
        b->len = ld_hms(o, secs * 1000000 + PyDateTime_DATE_GET_MICROSECOND(v)) - b->p;
        return 1;
    }
    return 0;
}

static PyObject *load_data_rows(PyObject *self, PyObject *args) {
    PyObject *rows, *encoders, *generic;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyList_Type, &rows, &PyList_Type, &encoders, &generic)) return NULL;
    Py_ssize_t ncol = PyList_GET_SIZE(encoders), nrows = PyList_GET_SIZE(rows);
    Buf b = {NULL, 0, 0};
    for (Py_ssize_t r = 0; r < nrows; r++) {
        PyObject *row = PyList_GET_ITEM(rows, r);
        if (!PyTuple_Check(row)) { PyErr_SetString(PyExc_TypeError, "a row image is a tuple"); goto fail; }
        /* zip(encoders, row): the shorter of the two */
        Py_ssize_t k, n = PyTuple_GET_SIZE(row) < ncol ? PyTuple_GET_SIZE(row) : ncol;
        for (k = 0; k < n; k++) {
            if (k && put_byte(&b, '\t') < 0) goto fail;
            PyObject *v = PyTuple_GET_ITEM(row, k), *enc = PyList_GET_ITEM(encoders, k);
            int done = enc == generic ? ld_value(&b, v) : 0;
            if (done < 0 || (!done && ld_encoded(&b, enc, v) < 0)) goto fail;
        }
        if (put_byte(&b, '\n') < 0) goto fail;
    }
    PyObject *out = PyBytes_FromStringAndSize(b.p ? b.p : "", b.len);
    PyMem_Free(b.p);
    return out;
fail:
    PyMem_Free(b.p);
    return NULL;
}

static PyMethodDef methods[] = {
    {"decode_rows", decode_rows, METH_VARARGS,
     "decode_rows(body, plan: Plan, pairs) -> [(row, row|None)]: every row image of a ROWS event body"},
    {"encode_batch", encode_batch, METH_VARARGS,
     "encode_batch(prefix, producer_id, end, complete, first_txn, created_us, last_commit_ts, meta, changes, "
     "op_index, many_rows_type=None) -> bytes: a Batch as codec.encode writes it"},
    {"decode_columns", decode_columns, METH_VARARGS,
     "decode_columns(avro, op_insert, op_read=-1) -> (producer_id, end, complete, first_txn, created_us, "
     "last_commit_ts, meta, tables, runs, images): a batch of inserts (and snapshot reads) with its image columns in "
     "Arrow layout (see codec.decode_columnar)"},
    {"column_values", column_values, METH_VARARGS,
     "column_values(kind, offset, count, validity, data, offsets) -> list: Python values of an Arrow column of wire "
     "values, as ColumnBlock.python_values makes them"},
    {"load_data_rows", load_data_rows, METH_VARARGS,
     "load_data_rows(rows, encoders, generic) -> bytes: row images as LOAD DATA lines, the bytes of "
     "ColumnStoreTarget.write_load_data's reference loop"},
    {"convert_fields", convert_fields, METH_VARARGS,
     "convert_fields(rows, ((index, TextConverter), ...)) -> list: fetched rows with those fields' text (bytes) "
     "made values by their converters (see snapshot/source.py)"},
    {"load_data_lines", load_data_lines, METH_VARARGS,
     "load_data_lines(n, [(mode, offset, validity, data, offsets)]) -> bytes: n rows of Arrow columns as LOAD DATA "
     "lines (see applier/targets/columnstore/loaddata.py)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cynomys._speedups",
                                    "Compiled hot path of the producer (see _speedups.c).", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    PyDateTime_IMPORT;
    if (!PyDateTimeAPI) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyObject *dec = PyImport_ImportModule("decimal");
    PyObject *model = PyImport_ImportModule("cynomys.core.model");
    if (!dec || !model) goto fail;
    DecimalType = PyObject_GetAttrString(dec, "Decimal");
    RawTemporalType = PyObject_GetAttrString(model, "RawTemporal");
    Py_DECREF(dec);
    Py_DECREF(model);
    dec = model = NULL;
    if (!DecimalType || !RawTemporalType) goto fail;
    if (PyType_Ready(&PlanType) < 0 || PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0) goto fail;
    if (PyType_Ready(&TextConverterType) < 0
        || PyModule_AddObjectRef(m, "TextConverter", (PyObject *)&TextConverterType) < 0) goto fail;
    Fallback = PyErr_NewException("cynomys._speedups.Fallback", NULL, NULL);
    if (!Fallback || PyModule_AddObjectRef(m, "Fallback", Fallback) < 0) goto fail;
#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) goto fail
    INTERN(S_file, "file"); INTERN(S_pos, "pos"); INTERN(S_gtid, "gtid"); INTERN(S_database, "database");
    INTERN(S_table, "table"); INTERN(S_columns, "columns"); INTERN(S_key, "key"); INTERN(S_indexes, "indexes"); INTERN(S_name, "name");
    INTERN(S_type, "type"); INTERN(S_nullable, "nullable"); INTERN(S_tid, "tid"); INTERN(S_sql, "sql");
    INTERN(S_op, "op"); INTERN(S_txn, "txn"); INTERN(S_commit_ts, "commit_ts"); INTERN(S_schema, "schema");
    INTERN(S_before, "before"); INTERN(S_after, "after"); INTERN(S_images, "images");
    INTERN(S_comma, ","); INTERN(S_f, "f");
#undef INTERN
    return m;
fail:
    Py_XDECREF(dec);
    Py_XDECREF(model);
    Py_DECREF(m);
    return NULL;
}
