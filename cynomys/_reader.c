/*
 * cynomys._reader: the binlog event reader in C (issue #28).
 *
 * The compiled twin of the reading half of parser/stream.py (BinlogSource)
 * and parser/files.py (FileReader), which stay the specification and the
 * fallback.  mysql-replication still opens the connection (handshake,
 * authentication, the COM_BINLOG_DUMP / GTID dump command); then this
 * reader takes the socket and reads the protocol's packets itself, or it
 * reads a binlog file.  For each event it does what BinlogSource does with
 * the library's event object:
 *
 *   - packets framed (3-byte length, sequence id, 16 MiB continuations),
 *     error packets and the end-of-stream packet recognised;
 *   - the common header read, the CRC32 trailer verified;
 *   - positions: every event's start and end, by the same rules as
 *     BinlogSource._convert and _span (a FORMAT_DESCRIPTION or an event
 *     with log_pos 0 does not move the position; a ROTATE does);
 *   - the kinds table (parser/kinds.py) handed in from Python: a kind the
 *     Python side reads itself (containers, MySQL GTID events) is handed
 *     back, an unknown kind is HALT;
 *   - ROTATE, MariaDB GTID, QUERY (its text; the statement rules stay in
 *     Python), TABLE_MAP (looked up by its body bytes: the Python side
 *     parses each distinct body once, parser/tablemap.py), ROWS (the rows
 *     decoded by cynomys._speedups' plan, or the reference decoder) and
 *     every other kind made into SourceEvent objects here.
 *
 * The bytes are read and framed, and the CRC32s checked, with the GIL
 * released; then the Python objects are made.  One call hands back a
 * batch: a list of SourceEvents, whose last item may instead be a tuple
 * asking the Python side for something:
 *
 *   ("handoff", code, event, start, end)  an event for the reference path
 *                                          (the batch stops after it, so the
 *                                          state it changes -- a TABLE_MAP's
 *                                          decoder, a FORMAT_DESCRIPTION's
 *                                          post-header lengths -- is in place
 *                                          before the next event);
 *   ("error", what, detail, offset)        a damaged stream/file or a lost
 *                                          connection, turned into the same
 *                                          Cynomys errors as the Python path;
 *   ("server_error", packet)               an error packet from the server
 *                                          (pymysql makes the exception);
 *   ("eof",)                               the server's end of a non-blocking
 *                                          dump; ("file_end",) in a file.
 *
 * Nothing here decides what an event means beyond what BinlogSource decides:
 * whatever is unusual (a declared post-header length the library would
 * honour, partial row images, an unknown status variable) is handed back to
 * the reference, which produces the reference result or the reference error.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------- */
/* CRC32 (IEEE 802.3, zlib's crc32), slice-by-8.                           */
/* ---------------------------------------------------------------------- */
static uint32_t crc_tab[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xFF];
}

static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) { crc = crc_tab[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8); n--; }
    while (n >= 8) {
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + 4, 4);
        a ^= crc;
        crc = crc_tab[7][a & 0xFF] ^ crc_tab[6][(a >> 8) & 0xFF] ^ crc_tab[5][(a >> 16) & 0xFF] ^
              crc_tab[4][a >> 24] ^ crc_tab[3][b & 0xFF] ^ crc_tab[2][(b >> 8) & 0xFF] ^
              crc_tab[1][(b >> 16) & 0xFF] ^ crc_tab[0][b >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_tab[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

static uint16_t u16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t u32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t u48(const unsigned char *p) { return (uint64_t)u32(p) | (uint64_t)u16(p + 4) << 32; }
static uint64_t u64(const unsigned char *p) { return (uint64_t)u32(p) | (uint64_t)u32(p + 4) << 32; }

/* The common header (parser/raw.py): timestamp u32, type u8, server_id u32,
 * event_size u32, log_pos u32, flags u16. */
#define HEADER_LEN 19
#define CHECKSUM_LEN 4
#define FLAGS_OFFSET 17
#define LOG_EVENT_BINLOG_IN_USE_F 0x1

enum {
    T_QUERY = 0x02, T_ROTATE = 0x04, T_FDE = 0x0F, T_TABLE_MAP = 0x13,
    T_WRITE_V1 = 0x17, T_UPDATE_V1 = 0x18, T_DELETE_V1 = 0x19,
    T_WRITE_V2 = 0x1E, T_UPDATE_V2 = 0x1F, T_DELETE_V2 = 0x20,
    T_MARIADB_GTID = 0xA2,
};

/* The CRC32 of an event; a FORMAT_DESCRIPTION of a file still being
 * written carries LOG_EVENT_BINLOG_IN_USE_F, set after its checksum was
 * computed: the server's own reader clears it before checking
 * (log_event.cc, event_checksum_test), and so do we. */
static int crc_ok(const unsigned char *ev, Py_ssize_t size) {
    uint32_t want = u32(ev + size - CHECKSUM_LEN);
    if (crc32_update(0, ev, (size_t)(size - CHECKSUM_LEN)) == want) return 1;
    if (ev[4] == T_FDE && (ev[FLAGS_OFFSET] & LOG_EVENT_BINLOG_IN_USE_F)) {
        unsigned char flag = (unsigned char)(ev[FLAGS_OFFSET] & ~LOG_EVENT_BINLOG_IN_USE_F);
        uint32_t c = crc32_update(0, ev, FLAGS_OFFSET);
        c = crc32_update(c, &flag, 1);
        c = crc32_update(c, ev + FLAGS_OFFSET + 1, (size_t)(size - CHECKSUM_LEN - FLAGS_OFFSET - 1));
        return c == want;
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Frames: the events (or other packets) found in the input buffer.        */
/* ---------------------------------------------------------------------- */
enum {
    F_EVENT,       /* an event: data/len */
    F_SKIP,        /* a packet the library ignores (not OK, not EOF, not error) */
    F_EOF,         /* the server's end-of-stream packet */
    F_SERVER_ERR,  /* an error packet: data/len is its payload */
    F_FILE_END,    /* the end of a binlog file (or of the region to read) */
    F_BAD,         /* a damaged stream/file: why (a static string), detail */
};

typedef struct {
    int what;
    const unsigned char *data;  /* event (header..end) or packet payload */
    Py_ssize_t len;
    Py_ssize_t next;            /* buffer offset after this frame */
    unsigned char *own;         /* data was copied here (a 16 MiB+ packet); freed with the frame */
    int seq;                    /* socket: the next sequence id after this frame */
    long long file_off;         /* file: the offset of the event in the file */
    const char *why;            /* F_BAD: one of the BAD_* names below */
    long long detail;           /* F_BAD: a number for the message */
} Frame;

/* F_BAD reasons; parser/creader.py turns each into the error the Python
 * path raises for the same damage. */
static const char BAD_CRC[] = "crc";                 /* the event's CRC32 does not match */
static const char BAD_SIZE[] = "size";               /* an event claims fewer bytes than its header */
static const char BAD_PACKET_SIZE[] = "packet_size"; /* the packet and the event's size disagree */
static const char BAD_LOG_POS[] = "log_pos";         /* file: log_pos is not where the event ends */
static const char BAD_SHORT_HEADER[] = "short_header"; /* file: ends inside an event header */
static const char BAD_SHORT_EVENT[] = "short_event";   /* file: ends inside an event */
static const char BAD_SEQ[] = "seq";                 /* socket: packet sequence id wrong */
static const char BAD_LOST[] = "lost";               /* socket: the connection ended */
static const char BAD_IO[] = "io";                   /* read error (errno in detail) */

#define MAX_FRAMES 1024
#define MAX_PACKET 0xFFFFFF

enum { MODE_SOCKET = 0, MODE_SOCKET_PY = 1, MODE_FILE = 2 };

typedef struct {
    PyObject_HEAD
    int mode;
    int fd;                     /* socket or file descriptor (not owned) */
    PyObject *sock;             /* MODE_SOCKET_PY: an object with recv_into (a TLS socket) */
    unsigned char *buf;
    Py_ssize_t cap, start, end; /* unread bytes are buf[start:end] */
    long long read_off;         /* file: the file offset of buf[end] */
    long long file_off;         /* file: the file offset of buf[start] */
    long long stop;             /* file: stop reading at this offset (0: the file's end) */
    int checksums;              /* events end with a CRC32 */
    int seq;                    /* socket: the sequence id of the next packet */
    volatile int closing;       /* close() was called */
    double deadline;            /* socket: read() waits until this (monotonic seconds), < 0: as long as it takes */
    int input_done;             /* socket: EOF/error seen; file: at its end */
    int rows_budget;            /* rows per batch (read()'s max_rows) */
    /* where reading is: the current binlog file name and offset */
    PyObject *file;             /* str */
    long long pos;
    PyObject *last_rotate;      /* file name the last ROTATE named (str or None) */
    /* tables */
    PyObject *by_body;          /* TABLE_MAP body (bytes) -> entry */
    PyObject *by_id;            /* table id (int) -> entry */
    PyObject *lib_table_map;    /* the library's table map, kept in step (entry's table object) */
    PyObject *decoders;         /* BinlogSource.decoders, kept in step (entry's last field) */
    PyObject *post_header;      /* bytes: the FORMAT_DESCRIPTION's post-header lengths, or None */
    /* from the Python side */
    PyObject *kinds;            /* tuple of 256 (basic, name, why, how) */
    unsigned char how[256];     /* per kind: HOW_* (the kinds' last field) */
    PyTypeObject *event_type;   /* parser.stream.SourceEvent */
    PyTypeObject *position_type;/* core.model.Position */
    PyObject *classify;         /* sql -> (basic, why) */
    PyObject *decode_rows;      /* cynomys._speedups.decode_rows, or None */
    PyObject *fallback;         /* cynomys._speedups.Fallback, or None */
    PyObject *info;             /* Basic.INFO */
    /* the last Position made (the next event's start is this one's end) */
    PyObject *last_pos_obj;
    PyObject *last_pos_file;
    long long last_pos;
    /* counters, for tests and cynomys status */
    long long n_events, n_handoffs;
} Reader;

/* Interned names of the dataclass fields. */
static PyObject *S_basic, *S_kind, *S_start, *S_end, *S_timestamp, *S_gtid, *S_standalone, *S_database,
    *S_table, *S_sql, *S_schema, *S_rows, *S_why, *S_detail, *S_file, *S_pos, *S_empty, *S_recv_into,
    *S_op, *S_tid, *S_txn, *S_commit_ts, *S_before, *S_after, *S_handoff, *S_error, *S_server_error,
    *S_eof, *S_file_end;
static PyObject *EMPTY_TUPLE;
/* Field dicts with every key, copied for each new object: a copy of a
 * small dict clones its key table, which is cheaper than inserting (and
 * growing) key by key.  Values are the defaults; the varying ones are set. */
static PyObject *EVENT_TEMPLATE, *POSITION_TEMPLATE;

/* An instance of a (frozen) dataclass from its field dict: what its
 * generated __init__ makes, without the per-field object.__setattr__ calls.
 *
 * The instance and its dict are not tracked by the cycle collector: a
 * SourceEvent, a Position or a Change refers only to values, row tuples
 * and schemas, never back to anything that refers to it, and a frozen
 * dataclass cannot be given such a reference later.  The producer makes
 * hundreds of thousands of them a second; tracked, they made the young
 * generation's collections walk every one (15-20% of reading and folding
 * a lineitem binlog).  Untracked containers count as outside references
 * for the collector, so what they hold is never freed early. */
static PyObject *new_instance(PyTypeObject *tp, PyObject *dict) {
    PyObject *o = tp->tp_new(tp, EMPTY_TUPLE, NULL);
    if (!o) return NULL;
    if (PyObject_GenericSetDict(o, dict, NULL) < 0) { Py_DECREF(o); return NULL; }
    if (PyObject_GC_IsTracked(o)) PyObject_GC_UnTrack(o);
    if (PyObject_GC_IsTracked(dict)) PyObject_GC_UnTrack(dict);
    return o;
}

static PyObject *make_position(Reader *r, long long pos) {
    if (r->last_pos_obj && r->last_pos == pos && r->last_pos_file == r->file) {
        Py_INCREF(r->last_pos_obj);
        return r->last_pos_obj;
    }
    PyObject *d = PyDict_Copy(POSITION_TEMPLATE), *p = NULL, *o = NULL;
    if (!d) return NULL;
    if (!(p = PyLong_FromLongLong(pos))) goto done;
    if (PyDict_SetItem(d, S_file, r->file) < 0 || PyDict_SetItem(d, S_pos, p) < 0) goto done;
    o = new_instance(r->position_type, d);
    if (o) {
        Py_INCREF(o);
        Py_XSETREF(r->last_pos_obj, o);
        Py_INCREF(r->file);
        Py_XSETREF(r->last_pos_file, r->file);
        r->last_pos = pos;
    }
done:
    Py_DECREF(d);
    Py_XDECREF(p);
    return o;
}

/* SourceEvent(basic, kind, start, end, timestamp, ...): the fields a caller
 * does not give take the dataclass defaults (rows: a new empty list). */
typedef struct {
    PyObject *gtid, *database, *table, *sql, *schema, *rows, *why;
    int standalone;
} Extra;

static PyObject *make_event(Reader *r, PyObject *basic, PyObject *kind, PyObject *start, PyObject *end,
                            uint32_t ts, Extra *x) {
    PyObject *d = PyDict_Copy(EVENT_TEMPLATE), *o = NULL, *t = NULL, *rows = NULL;
    if (!d) return NULL;
    if (!(t = PyLong_FromUnsignedLong(ts))) goto done;
    if (x && x->rows) { rows = x->rows; Py_INCREF(rows); }
    else if (!(rows = PyList_New(0))) goto done;
#define PUT(k, v) if (PyDict_SetItem(d, k, v) < 0) goto done
    PUT(S_basic, basic); PUT(S_kind, kind); PUT(S_start, start); PUT(S_end, end); PUT(S_timestamp, t);
    PUT(S_rows, rows);
    if (x) {
        if (x->gtid) PUT(S_gtid, x->gtid);
        if (x->standalone) PUT(S_standalone, Py_True);
        if (x->database) PUT(S_database, x->database);
        if (x->table) PUT(S_table, x->table);
        if (x->sql) PUT(S_sql, x->sql);
        if (x->schema) PUT(S_schema, x->schema);
        if (x->why) PUT(S_why, x->why);
    }
    o = new_instance(r->event_type, d);
done:
    Py_DECREF(d);
    Py_XDECREF(t);
    Py_XDECREF(rows);
    return o;
}

/* ---------------------------------------------------------------------- */
/* Input: reading more bytes (GIL released where it can be).               */
/* ---------------------------------------------------------------------- */
#define INITIAL_CAP (1 << 20)
#define POLL_MS 200

/* Room for at least `need` more bytes after buf[end]: unread bytes moved
 * to the front, the buffer grown for a large event.  No Python calls. */
static int make_room(Reader *r, Py_ssize_t need) {
    if (r->start > 0 && r->cap - r->end < need) {
        memmove(r->buf, r->buf + r->start, (size_t)(r->end - r->start));
        r->end -= r->start;
        r->start = 0;
    }
    if (r->cap - r->end < need) {
        Py_ssize_t cap = r->cap;
        while (cap - r->end < need) cap *= 2;
        unsigned char *b = realloc(r->buf, (size_t)cap);
        if (!b) return -1;
        r->buf = b;
        r->cap = cap;
    }
    return 0;
}

static double monotonic(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Socket, plain: wait until readable (or closing, or the deadline), then
 * recv what is there.  Returns bytes read, 0 at the peer's end, -1 error
 * (errno), -2 nothing (non-blocking and nothing there, closing, or the
 * deadline passed).  GIL released by the caller. */
static Py_ssize_t recv_some(Reader *r, int block) {
    for (;;) {
        if (r->closing) return -2;
        if (block) {
            int wait = POLL_MS;
            if (r->deadline >= 0) {
                double left = r->deadline - monotonic();
                wait = left <= 0 ? 0 : left * 1000 < wait ? (int)(left * 1000) + 1 : wait;
            }
            struct pollfd p = {r->fd, POLLIN, 0};
            int k = poll(&p, 1, wait);
            if (k < 0) { if (errno == EINTR) continue; return -1; }
            if (k == 0) {
                if (r->deadline >= 0 && monotonic() >= r->deadline) return -2;
                continue;
            }
        }
        ssize_t n = recv(r->fd, r->buf + r->end, (size_t)(r->cap - r->end), block ? 0 : MSG_DONTWAIT);
        if (r->closing) return -2;  /* close() shut the socket down: not a lost connection */
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) { if (block) continue; return -2; }
            return -1;
        }
        return (Py_ssize_t)n;
    }
}

/* Socket over TLS: the socket object's recv_into, with the GIL (the ssl
 * module releases it while it reads); it was given a timeout so that a
 * close() is noticed.  Same returns as recv_some, -3: a Python error. */
static Py_ssize_t recv_py(Reader *r) {
    for (;;) {
        if (r->closing || (r->deadline >= 0 && monotonic() >= r->deadline)) return -2;
        PyObject *mv = PyMemoryView_FromMemory((char *)r->buf + r->end, r->cap - r->end, PyBUF_WRITE);
        if (!mv) return -3;
        PyObject *n = PyObject_CallMethodOneArg(r->sock, S_recv_into, mv);
        Py_DECREF(mv);
        if (!n) {
            if (PyErr_ExceptionMatches(PyExc_TimeoutError)) { PyErr_Clear(); continue; }
            if (PyErr_ExceptionMatches(PyExc_OSError)) { PyErr_Clear(); errno = EIO; return -1; }
            return -3;
        }
        Py_ssize_t k = PyLong_AsSsize_t(n);
        Py_DECREF(n);
        if (k < 0 && PyErr_Occurred()) return -3;
        return k;
    }
}

/* ---------------------------------------------------------------------- */
/* Framing (no Python calls: runs with the GIL released).                  */
/* ---------------------------------------------------------------------- */
static void bad(Frame *f, const char *why, long long detail) {
    f->what = F_BAD;
    f->why = why;
    f->detail = detail;
}

/* The event in a frame: size against the header, CRC32. */
static void check_event(Reader *r, Frame *f) {
    if (f->len < HEADER_LEN) { bad(f, BAD_PACKET_SIZE, f->len); return; }
    uint32_t size = u32(f->data + 9);
    if (size < HEADER_LEN) { bad(f, BAD_SIZE, size); return; }
    if ((Py_ssize_t)size != f->len) { bad(f, BAD_PACKET_SIZE, f->len); return; }
    if (r->checksums && (size < HEADER_LEN + CHECKSUM_LEN || !crc_ok(f->data, size))) bad(f, BAD_CRC, 0);
}

/* Frames of socket packets from buf[start:end].  Returns how many; *more
 * says whether an incomplete packet waits for bytes. */
static int frame_socket(Reader *r, Frame *fr, int max, int *more) {
    Py_ssize_t at = r->start;
    int n = 0, seq = r->seq;
    *more = 0;
    while (n < max) {
        const unsigned char *p = r->buf + at;
        Py_ssize_t avail = r->end - at;
        if (avail < 4) { *more = 1; break; }
        Py_ssize_t len = p[0] | p[1] << 8 | p[2] << 16;
        Frame *f = &fr[n];
        memset(f, 0, sizeof(*f));
        if (p[3] != seq) {
            bad(f, BAD_SEQ, p[3]);
            f->next = at;
            n++;
            break;
        }
        if (len == MAX_PACKET) {
            /* A message of 16 MiB or more continues in the next packets:
             * all parts must be here; their payloads are joined in a copy. */
            Py_ssize_t total = 0, q = at;
            int s = seq, complete = 0;
            for (;;) {
                if (r->end - q < 4) break;
                Py_ssize_t l = r->buf[q] | r->buf[q + 1] << 8 | r->buf[q + 2] << 16;
                if (r->buf[q + 3] != s) { complete = -1; break; }
                if (r->end - q - 4 < l) break;
                total += l;
                q += 4 + l;
                s = (s + 1) & 0xFF;
                if (l < MAX_PACKET) { complete = 1; break; }
            }
            if (complete == 0) { *more = 1; break; }
            if (complete < 0) { bad(f, BAD_SEQ, -1); f->next = at; n++; break; }
            unsigned char *own = malloc((size_t)total);
            if (!own) { bad(f, BAD_IO, ENOMEM); f->next = at; n++; break; }
            Py_ssize_t w = 0;
            q = at;
            for (;;) {
                Py_ssize_t l = r->buf[q] | r->buf[q + 1] << 8 | r->buf[q + 2] << 16;
                memcpy(own + w, r->buf + q + 4, (size_t)l);
                w += l;
                q += 4 + l;
                if (l < MAX_PACKET) break;
            }
            f->own = own;
            f->data = own;
            f->len = total;
            f->next = q;
            seq = s;
        } else {
            if (avail - 4 < len) { *more = 1; break; }
            f->data = p + 4;
            f->len = len;
            f->next = at + 4 + len;
            seq = (seq + 1) & 0xFF;
        }
        f->seq = seq;
        at = f->next;
        n++;
        /* pymysql: an error packet starts with 0xFF; the end of a
         * non-blocking dump is 0xFE and shorter than 9 bytes; the library
         * skips any other packet that is not OK (0x00). */
        if (f->len > 0 && f->data[0] == 0xFF) { f->what = F_SERVER_ERR; break; }
        if (f->len > 0 && f->data[0] == 0xFE && f->len < 9) { f->what = F_EOF; break; }
        if (f->len == 0 || f->data[0] != 0x00) { f->what = F_SKIP; continue; }
        f->what = F_EVENT;
        f->data += 1;
        f->len -= 1;
        check_event(r, f);
        if (f->what == F_BAD) break;
    }
    return n;
}

/* Frames of file events from buf[start:end] (the file's bytes from
 * file_off).  *more: more bytes are needed (and the file may have them). */
static int frame_file(Reader *r, Frame *fr, int max, int *more, int at_eof) {
    Py_ssize_t at = r->start;
    long long off = r->file_off;
    int n = 0;
    *more = 0;
    while (n < max) {
        Frame *f = &fr[n];
        memset(f, 0, sizeof(*f));
        f->file_off = off;
        f->next = at;
        if (r->stop && off >= r->stop) { f->what = F_FILE_END; n++; break; }
        Py_ssize_t avail = r->end - at;
        if (avail < HEADER_LEN) {
            if (!at_eof) { *more = 1; break; }
            if (avail == 0) f->what = F_FILE_END;
            else bad(f, BAD_SHORT_HEADER, avail);
            n++;
            break;
        }
        const unsigned char *p = r->buf + at;
        uint32_t size = u32(p + 9), log_pos = u32(p + 13);
        if (size < HEADER_LEN) { bad(f, BAD_SIZE, size); n++; break; }
        /* log_pos of a binlog event is where the next one starts: a start
         * offset inside an event, or garbage, shows here (files.py). */
        if (log_pos && (long long)log_pos != off + size) { bad(f, BAD_LOG_POS, log_pos); n++; break; }
        if (avail < (Py_ssize_t)size) {
            if (!at_eof) { *more = 1; break; }
            bad(f, BAD_SHORT_EVENT, size);
            n++;
            break;
        }
        f->what = F_EVENT;
        f->data = p;
        f->len = size;
        f->next = at + size;
        if (r->checksums && (size < HEADER_LEN + CHECKSUM_LEN || !crc_ok(p, size))) {
            bad(f, BAD_CRC, 0);
            n++;
            break;
        }
        at += size;
        off += size;
        n++;
    }
    return n;
}

static void free_frames(Frame *fr, int from, int n) {
    for (int i = from; i < n; i++) { free(fr[i].own); fr[i].own = NULL; }
}

/* Fill frames: read until at least one frame is complete (blocking), then
 * take what else is there without waiting.  GIL released inside, except
 * for TLS sockets.  Returns frames, 0 when closing; -1 with a Python error. */
static int fill(Reader *r, Frame *fr, int max) {
    int n = 0, more = 0;
    if (r->mode == MODE_FILE) {
        int at_eof = 0;
        Py_BEGIN_ALLOW_THREADS
        for (;;) {
            n = frame_file(r, fr, max, &more, at_eof);
            if (n > 0 || !more) break;
            /* Event sizes say how much is needed; read big pieces. */
            Py_ssize_t need = HEADER_LEN;
            if (r->end - r->start >= HEADER_LEN) need = (Py_ssize_t)u32(r->buf + r->start + 9);
            if (make_room(r, need > INITIAL_CAP ? need : INITIAL_CAP / 4) < 0) { errno = ENOMEM; n = -2; break; }
            ssize_t k;
            do { k = pread(r->fd, r->buf + r->end, (size_t)(r->cap - r->end), (off_t)r->read_off); }
            while (k < 0 && errno == EINTR);
            if (k < 0) { n = -2; break; }
            if (k == 0) at_eof = 1;
            r->end += k;
            r->read_off += k;
        }
        Py_END_ALLOW_THREADS
        if (n == -2) {
            memset(&fr[0], 0, sizeof(fr[0]));
            bad(&fr[0], BAD_IO, errno);
            fr[0].next = r->start;
            fr[0].file_off = r->file_off;
            return 1;
        }
        return n;
    }
    for (;;) {
        n = frame_socket(r, fr, max, &more);
        if (n > 0) break;
        if (r->closing) return 0;
        if (make_room(r, 1 << 16) < 0) { PyErr_NoMemory(); return -1; }
        Py_ssize_t k;
        if (r->mode == MODE_SOCKET_PY) {
            k = recv_py(r);
            if (k == -3) return -1;
        } else {
            Py_BEGIN_ALLOW_THREADS
            k = recv_some(r, 1);
            if (k > 0) {
                r->end += k;
                /* Whatever else has arrived, without waiting. */
                while (r->cap - r->end >= (1 << 16)) {
                    Py_ssize_t m = recv_some(r, 0);
                    if (m <= 0) break;
                    r->end += m;
                }
                k = 1;
            }
            Py_END_ALLOW_THREADS
            if (k > 0) continue;
        }
        if (k > 0) { r->end += k; continue; }
        if (k == -2) return 0;  /* closing, or nothing before the deadline */
        memset(&fr[0], 0, sizeof(fr[0]));
        bad(&fr[0], k == 0 ? BAD_LOST : BAD_IO, k == 0 ? 0 : errno);
        fr[0].next = r->start;
        return 1;
    }
    return n;
}

/* ---------------------------------------------------------------------- */
/* Events -> SourceEvents.                                                  */
/* ---------------------------------------------------------------------- */
static PyObject *kind_field(Reader *r, int type, int i) {
    return PyTuple_GET_ITEM(PyTuple_GET_ITEM(r->kinds, type), i);
}

static int post_header_len(Reader *r, int type, int dflt) {
    if (r->post_header == Py_None || !PyBytes_Check(r->post_header)) return dflt;
    Py_ssize_t i = type - 1;
    if (i < 0 || i >= PyBytes_GET_SIZE(r->post_header)) return dflt;
    return (unsigned char)PyBytes_AS_STRING(r->post_header)[i];
}

/* What the reader does with a kind (parser/creader.py kinds_table). */
enum {
    HOW_HERE = 0,     /* read here (QUERY, ROTATE, GTID, TABLE_MAP, ROWS, or a SourceEvent of its kind) */
    HOW_DECODER = 1,  /* Kind.decoder: read by the Python side from its bytes, placed by its header */
    HOW_LIBRARY = 2,  /* parsed by the library on the Python side (FORMAT_DESCRIPTION, partial JSON rows) */
};

static PyObject *handoff(Reader *r, const unsigned char *ev, Py_ssize_t len, PyObject *start, PyObject *end) {
    r->n_handoffs++;
    return Py_BuildValue("(Oiy#OO)", S_handoff, ev[4], (const char *)ev, len, start, end);
}

/* Status variables of a QUERY event, walked as the library walks them
 * (QueryEvent._read_status_vars_value_for_key): 1 when they end exactly
 * where their declared length ends; 0 for anything else (an unknown code
 * makes the library raise, a walk past the end reads elsewhere): then the
 * library decides. */
static int status_vars_ok(const unsigned char *p, const unsigned char *end) {
    while (p < end) {
        int key = *p++;
        Py_ssize_t n;
        switch (key) {
        case 0x00: n = 4; break;            /* Q_FLAGS2 */
        case 0x01: n = 8; break;            /* Q_SQL_MODE */
        case 0x02: n = 0; break;            /* Q_CATALOG (the library reads nothing) */
        case 0x03: n = 4; break;            /* Q_AUTO_INCREMENT */
        case 0x04: n = 6; break;            /* Q_CHARSET */
        case 0x05: case 0x06:               /* Q_TIME_ZONE, Q_CATALOG_NZ: length + bytes */
            if (p >= end) return 0;
            n = 1 + *p;
            break;
        case 0x07: case 0x08: n = 2; break; /* Q_LC_TIME_NAMES, Q_CHARSET_DATABASE */
        case 0x09: n = 8; break;            /* Q_TABLE_MAP_FOR_UPDATE */
        case 0x0A: n = 0; break;            /* Q_MASTER_DATA_WRITTEN */
        case 0x0B: {                        /* Q_INVOKER: user, host, each length + bytes */
            if (p >= end) return 0;
            Py_ssize_t user = *p;
            if (p + 1 + user >= end) return 0;
            n = 1 + user + 1 + p[1 + user];
            break;
        }
        case 0x0C: {                        /* Q_UPDATED_DB_NAMES */
            if (p >= end) return 0;
            int count = *p++;
            if (count == 254) { n = 0; break; }  /* one database named "": no names follow */
            for (int i = 0; i < count; i++) {
                while (p < end && *p) p++;
                if (p >= end) return 0;
                p++;
            }
            n = 0;
            break;
        }
        case 0x0D: n = 3; break;            /* Q_MICROSECONDS */
        case 0x0E: case 0x0F: n = 0; break; /* Q_COMMIT_TS, Q_COMMIT_TS2 */
        case 0x10: n = 1; break;            /* Q_EXPLICIT_DEFAULTS_FOR_TIMESTAMP */
        case 0x11: n = 8; break;            /* Q_DDL_LOGGED_WITH_XID */
        case 0x12: n = 2; break;            /* Q_DEFAULT_COLLATION_FOR_UTF8MB4 */
        case 0x13: case 0x14: n = 1; break; /* Q_SQL_REQUIRE_PRIMARY_KEY, Q_DEFAULT_TABLE_ENCRYPTION */
        case 0x80: n = 3; break;            /* Q_HRNOW (MariaDB) */
        case 0x81: n = 8; break;            /* Q_XID (MariaDB) */
        default: return 0;
        }
        p += n;
    }
    return p == end;
}

/* QUERY_EVENT (BinlogSource._convert: sorted by its statement text). */
static PyObject *query_event(Reader *r, const unsigned char *ev, const unsigned char *body, const unsigned char *end,
                             Py_ssize_t len, PyObject *start, PyObject *stop, uint32_t ts) {
    if (end - body < 13 || post_header_len(r, T_QUERY, 13) != 13) return handoff(r, ev, len, start, stop);
    int db_len = body[8];
    Py_ssize_t status_len = u16(body + 11);
    const unsigned char *status = body + 13, *db = status + status_len;
    if (db + db_len + 1 > end || !status_vars_ok(status, db)) return handoff(r, ev, len, start, stop);
    const unsigned char *sql = db + db_len + 1;
    PyObject *text = PyUnicode_DecodeUTF8((const char *)sql, end - sql, "backslashreplace");
    PyObject *database = PyUnicode_DecodeUTF8((const char *)db, db_len, "replace");
    PyObject *rule = NULL, *out = NULL;
    if (!text || !database) goto done;
    if (!(rule = PyObject_CallOneArg(r->classify, text))) goto done;
    if (!PyTuple_Check(rule) || PyTuple_GET_SIZE(rule) != 2) {
        PyErr_SetString(PyExc_TypeError, "classify must return (basic, why)");
        goto done;
    }
    Extra x = {0};
    x.sql = text;
    x.database = database;
    x.why = PyTuple_GET_ITEM(rule, 1);
    out = make_event(r, PyTuple_GET_ITEM(rule, 0), kind_field(r, T_QUERY, 1), start, stop, ts, &x);
done:
    Py_XDECREF(text);
    Py_XDECREF(database);
    Py_XDECREF(rule);
    return out;
}

/* Entry tuples (parser/creader.py table_entry): (filtered, database,
 * table, schema, plan, rows_fn, ncols, table_obj, BinlogSource.decoders'
 * entry or None). */
enum { E_FILTERED, E_DATABASE, E_TABLE, E_SCHEMA, E_PLAN, E_ROWS_FN, E_NCOLS, E_TABLE_OBJ, E_SOURCE, E_SIZE };

/* A table id mapped to an entry: here, in the library's table map and in
 * BinlogSource.decoders (what the Python path reads rows with when an
 * event is handed to it); a filtered table has no decoder there. */
static int map_table(Reader *r, PyObject *tid, PyObject *entry) {
    if (PyDict_SetItem(r->by_id, tid, entry) < 0) return -1;
    if (PyDict_SetItem(r->lib_table_map, tid, PyTuple_GET_ITEM(entry, E_TABLE_OBJ)) < 0) return -1;
    PyObject *src = PyTuple_GET_ITEM(entry, E_SOURCE);
    if (src != Py_None) return PyDict_SetItem(r->decoders, tid, src);
    if (PyDict_DelItem(r->decoders, tid) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
        PyErr_Clear();
    }
    return 0;
}

static PyObject *rows_event(Reader *r, int type, const unsigned char *ev, const unsigned char *body,
                            const unsigned char *end, Py_ssize_t len, PyObject *start, PyObject *stop,
                            uint32_t ts, int *produced_rows) {
    int v2 = type >= T_WRITE_V2, update = type == T_UPDATE_V1 || type == T_UPDATE_V2;
    int known = v2 ? 10 : 8;
    if (end - body < known || post_header_len(r, type, known) != known) return handoff(r, ev, len, start, stop);
    uint64_t table_id = u48(body);
    const unsigned char *p = body + 8;
    if (v2) {
        if (u16(p) > 2) return handoff(r, ev, len, start, stop);  /* extra row data: the library reads it */
        p += 2;
    }
    if (p >= end || *p >= 0xFB) return handoff(r, ev, len, start, stop);  /* a column count >= 251 */
    Py_ssize_t ncols = *p++, nb = (ncols + 7) / 8;
    if (end - p < nb * (update ? 2 : 1)) return handoff(r, ev, len, start, stop);
    const unsigned char *present = p, *present2 = p + nb;
    p += nb * (update ? 2 : 1);
    PyObject *tid = PyLong_FromUnsignedLongLong(table_id);
    if (!tid) return NULL;
    PyObject *entry = PyDict_GetItemWithError(r->by_id, tid);
    Py_DECREF(tid);
    if (!entry) {
        if (PyErr_Occurred()) return NULL;
        /* The library drops such an event (no table in its map); the
         * reference then has nothing to decode it with: stop. */
        return Py_BuildValue("(OsLL)", S_error, "no_table_map", (long long)table_id, 0LL);
    }
    if (PyTuple_GET_ITEM(entry, E_FILTERED) == Py_True) { Py_RETURN_NONE; }
    int full = ncols == PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, E_NCOLS));
    for (Py_ssize_t i = 0; full && i < nb; i++) {
        unsigned char want = (unsigned char)(i < nb - 1 || ncols % 8 == 0 ? 0xFF : (1 << (ncols % 8)) - 1);
        if (present[i] != want || (update && present2[i] != want)) full = 0;
    }
    if (!full) return handoff(r, ev, len, start, stop);  /* partial images: the reference refuses them */
    PyObject *buf = PyBytes_FromStringAndSize((const char *)p, end - p), *rows = NULL, *out = NULL;
    if (!buf) return NULL;
    PyObject *plan = PyTuple_GET_ITEM(entry, E_PLAN);
    if (plan != Py_None && r->decode_rows != Py_None) {
        rows = PyObject_CallFunctionObjArgs(r->decode_rows, buf, plan, update ? Py_True : Py_False, NULL);
        if (!rows && r->fallback != Py_None && PyErr_ExceptionMatches(r->fallback)) PyErr_Clear();
        else if (!rows) goto done;
    }
    if (!rows) {
        /* The reference decoder (TableDecoder.rows: it retries the compiled
         * call, counts the fallback and decodes in Python). */
        PyObject *mask = _PyLong_FromByteArray(present, (size_t)nb, 1, 0);
        if (!mask) goto done;
        rows = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(entry, E_ROWS_FN), buf, mask,
                                            update ? Py_True : Py_False, NULL);
        Py_DECREF(mask);
        if (!rows) goto done;
    }
    if (PyList_Check(rows)) {
        *produced_rows += (int)PyList_GET_SIZE(rows);
        /* A list of row tuples (see new_instance): nothing refers back. */
        if (PyObject_GC_IsTracked(rows)) PyObject_GC_UnTrack(rows);
    }
    Extra x = {0};
    x.database = PyTuple_GET_ITEM(entry, E_DATABASE);
    x.table = PyTuple_GET_ITEM(entry, E_TABLE);
    x.schema = PyTuple_GET_ITEM(entry, E_SCHEMA);
    x.rows = rows;
    out = make_event(r, kind_field(r, type, 0), kind_field(r, type, 1), start, stop, ts, &x);
done:
    Py_DECREF(buf);
    Py_XDECREF(rows);
    return out;
}

/* TABLE_MAP: known body -> its entry for this table id (no SourceEvent);
 * else the Python side parses it (and calls remember()). */
static PyObject *table_map_event(Reader *r, const unsigned char *ev, const unsigned char *body,
                                 const unsigned char *end, Py_ssize_t len, PyObject *start, PyObject *stop) {
    if (end - body < 8) return handoff(r, ev, len, start, stop);
    PyObject *key = PyBytes_FromStringAndSize((const char *)body, end - body);
    if (!key) return NULL;
    PyObject *entry = PyDict_GetItemWithError(r->by_body, key);
    Py_DECREF(key);
    if (!entry) {
        if (PyErr_Occurred()) return NULL;
        return handoff(r, ev, len, start, stop);
    }
    PyObject *tid = PyLong_FromUnsignedLongLong(u48(body));
    if (!tid) return NULL;
    int rc = map_table(r, tid, entry);
    Py_DECREF(tid);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static int clear_tables(Reader *r) {
    PyDict_Clear(r->by_id);
    PyDict_Clear(r->lib_table_map);
    return 0;
}

/* One event -> a SourceEvent, None (nothing to hand on), or a tuple (a
 * handoff or an error: the batch ends with it). */
static PyObject *event(Reader *r, const unsigned char *ev, Py_ssize_t len, int *produced_rows) {
    uint32_t ts = u32(ev), size = u32(ev + 9), log_pos = u32(ev + 13);
    int type = ev[4];
    const unsigned char *body = ev + HEADER_LEN, *end = ev + len - (r->checksums ? CHECKSUM_LEN : 0);
    r->n_events++;
    if (type == T_ROTATE) {
        /* The rotate names the next file; reading follows it.  A real
         * rotate (timestamp set) ends a server's file: table ids may be
         * reused after it (the library forgets its table map). */
        if (end - body < 8) return Py_BuildValue("(OsLL)", S_error, "short_rotate", (long long)len, 0LL);
        PyObject *name = PyUnicode_DecodeUTF8((const char *)body + 8, end - body - 8, NULL);
        if (!name) return NULL;
        Py_SETREF(r->file, name);
        Py_INCREF(name);
        Py_XSETREF(r->last_rotate, name);
        r->pos = (long long)u64(body);
        if (ts != 0) clear_tables(r);
        PyObject *here = make_position(r, r->pos);
        if (!here) return NULL;
        PyObject *out = make_event(r, kind_field(r, type, 0), kind_field(r, type, 1), here, here, ts, NULL);
        Py_DECREF(here);
        return out;
    }
    PyObject *start, *stop, *out = NULL;
    if (r->how[type] == HOW_DECODER) {
        /* BinlogSource._span: a container or a MySQL GTID event is where
         * its header says, whatever that is. */
        r->pos = (long long)log_pos;
        start = make_position(r, (long long)log_pos - size);
        stop = start ? make_position(r, log_pos) : NULL;
        if (start && stop) out = handoff(r, ev, len, start, stop);
        Py_XDECREF(start);
        Py_XDECREF(stop);
        return out;
    }
    if (type == T_FDE || !log_pos) {
        /* A FORMAT_DESCRIPTION re-sent on connect carries its original
         * offset, not ours: it must not move the position backwards. */
        PyObject *here = make_position(r, r->pos);
        if (!here) return NULL;
        if (type == T_FDE) out = handoff(r, ev, len, here, here);  /* its post-header lengths, mysql_version */
        else out = make_event(r, r->info, kind_field(r, type, 1), here, here, ts, NULL);
        Py_DECREF(here);
        return out;
    }
    start = make_position(r, (long long)log_pos - size);
    if (!start) return NULL;
    r->pos = (long long)log_pos;
    stop = make_position(r, log_pos);
    if (!stop) { Py_DECREF(start); return NULL; }
    switch (type) {
    case T_QUERY:
        out = query_event(r, ev, body, end, len, start, stop, ts);
        break;
    case T_MARIADB_GTID: {
        if (end - body < 13) { out = handoff(r, ev, len, start, stop); break; }
        PyObject *gtid = PyUnicode_FromFormat("%lu-%lu-%llu", (unsigned long)u32(body + 8),
                                              (unsigned long)u32(ev + 5), (unsigned long long)u64(body));
        if (!gtid) break;
        Extra x = {0};
        x.gtid = gtid;
        x.standalone = body[12] & 1;  /* FL_STANDALONE: a statement with no BEGIN/COMMIT */
        out = make_event(r, kind_field(r, type, 0), kind_field(r, type, 1), start, stop, ts, &x);
        Py_DECREF(gtid);
        break;
    }
    case T_TABLE_MAP:
        out = table_map_event(r, ev, body, end, len, start, stop);
        break;
    case T_WRITE_V1: case T_UPDATE_V1: case T_DELETE_V1:
    case T_WRITE_V2: case T_UPDATE_V2: case T_DELETE_V2:
        out = rows_event(r, type, ev, body, end, len, start, stop, ts, produced_rows);
        break;
    default: {
        if (r->how[type] == HOW_LIBRARY) {
            /* A kind the library parses into rows (partial JSON updates):
             * the reference reads it. */
            out = handoff(r, ev, len, start, stop);
            break;
        }
        Extra x = {0};
        x.why = kind_field(r, type, 2);
        out = make_event(r, kind_field(r, type, 0), kind_field(r, type, 1), start, stop, ts, &x);
    }
    }
    Py_DECREF(start);
    Py_DECREF(stop);
    return out;
}

static PyObject *bad_item(Frame *f) {
    return Py_BuildValue("(OsLL)", S_error, f->why, f->detail, f->file_off);
}

/* Frames -> items appended to out, until a tuple (handoff, error, end) or
 * the budgets.  Sets r->start/seq/file_off past what was consumed.
 * Returns 1: the batch is complete; 0: go on reading; -1: Python error. */
static int process(Reader *r, Frame *fr, int n, PyObject *out, int max_events) {
    int rows = 0, done = 0, i = 0;
    for (; i < n && !done; i++) {
        Frame *f = &fr[i];
        PyObject *item = NULL;
        switch (f->what) {
        case F_SKIP:
            break;
        case F_EOF:
            r->input_done = 1;
            item = Py_BuildValue("(O)", S_eof);
            break;
        case F_FILE_END:
            r->input_done = 1;
            item = Py_BuildValue("(O)", S_file_end);
            break;
        case F_SERVER_ERR:
            r->input_done = 1;
            item = Py_BuildValue("(Oy#)", S_server_error, (const char *)f->data, f->len);
            break;
        case F_BAD:
            r->input_done = 1;
            item = bad_item(f);
            break;
        default:
            item = event(r, f->data, f->len, &rows);
            if (!item) goto fail;
            if (item == Py_None) { Py_DECREF(item); item = NULL; }
        }
        if (f->what == F_BAD || f->what == F_SERVER_ERR || f->what == F_EOF || f->what == F_FILE_END) {
            /* stays where it is: nothing after it is read */
        } else {
            r->start = f->next;
            r->seq = f->seq;
            if (r->mode == MODE_FILE) r->file_off = f->file_off + f->len;
        }
        if (item) {
            int stop = PyTuple_Check(item);
            if (PyList_Append(out, item) < 0) { Py_DECREF(item); goto fail; }
            Py_DECREF(item);
            if (stop) done = 1;
        }
        if (PyList_GET_SIZE(out) >= max_events || rows >= r->rows_budget) done = 1;
    }
    free_frames(fr, 0, n);
    return done;
fail:
    free_frames(fr, 0, n);
    return -1;
}

/* read(max_events=256, max_rows=4096, timeout=None) -> list (see the
 * file's comment); [] when closing, or (socket) when nothing came within
 * timeout seconds. */
static PyObject *Reader_read(Reader *r, PyObject *args, PyObject *kw) {
    static char *names[] = {"max_events", "max_rows", "timeout", NULL};
    int max_events = 256, max_rows = 4096;
    PyObject *timeout = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iiO:read", names, &max_events, &max_rows, &timeout)) return NULL;
    r->deadline = -1;
    if (timeout != Py_None) {
        double t = PyFloat_AsDouble(timeout);
        if (t == -1.0 && PyErr_Occurred()) return NULL;
        r->deadline = monotonic() + (t > 0 ? t : 0);
    }
    if (max_events < 1) max_events = 1;
    if (max_events > MAX_FRAMES) max_events = MAX_FRAMES;
    r->rows_budget = max_rows < 1 ? 1 : max_rows;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    if (r->input_done || r->fd < 0) return out;
    Frame fr[MAX_FRAMES];
    for (;;) {
        int n = fill(r, fr, max_events - (int)PyList_GET_SIZE(out));
        if (n < 0) { Py_DECREF(out); return NULL; }
        if (n == 0) return out;  /* closing, or the deadline */
        int k = process(r, fr, n, out, max_events);
        if (k < 0) { Py_DECREF(out); return NULL; }
        if (k > 0 || PyList_GET_SIZE(out) > 0) return out;
        /* Nothing to hand on yet (TABLE_MAPs, skipped packets): read on. */
    }
}

/* feed(event, checksummed) -> list: one event given as bytes (the ROTATE
 * and FORMAT_DESCRIPTION files.py makes up for each file), through the
 * same code. */
static PyObject *Reader_feed(Reader *r, PyObject *args) {
    Py_buffer b;
    int checksummed;
    if (!PyArg_ParseTuple(args, "y*p:feed", &b, &checksummed)) return NULL;
    PyObject *out = PyList_New(0), *item = NULL;
    int saved = r->checksums, rows = 0;
    if (!out) goto done;
    if (b.len < HEADER_LEN) { PyErr_SetString(PyExc_ValueError, "feed: shorter than an event header"); goto fail; }
    r->checksums = checksummed;
    item = event(r, (const unsigned char *)b.buf, b.len, &rows);
    r->checksums = saved;
    if (!item) goto fail;
    if (item != Py_None && PyList_Append(out, item) < 0) goto fail;
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(item);
    PyBuffer_Release(&b);
    return out;
}

/* remember(body, entry): a TABLE_MAP body's entry, from now on for every
 * event with this body; and for its table id now. */
#define MAX_BODIES 4096
static PyObject *Reader_remember(Reader *r, PyObject *args) {
    PyObject *body, *entry;
    if (!PyArg_ParseTuple(args, "SO!:remember", &body, &PyTuple_Type, &entry)) return NULL;
    if (PyTuple_GET_SIZE(entry) != E_SIZE || PyBytes_GET_SIZE(body) < 8) {
        PyErr_SetString(PyExc_ValueError, "remember: (body, 9-tuple entry)");
        return NULL;
    }
    /* Table ids change after DDL and restarts: old bodies are dropped
     * wholesale past this many (parser/tablemap.py MAX_BODIES). */
    if (PyDict_GET_SIZE(r->by_body) >= MAX_BODIES) PyDict_Clear(r->by_body);
    if (PyDict_SetItem(r->by_body, body, entry) < 0) return NULL;
    PyObject *tid = PyLong_FromUnsignedLongLong(u48((const unsigned char *)PyBytes_AS_STRING(body)));
    if (!tid) return NULL;
    int rc = map_table(r, tid, entry);
    Py_DECREF(tid);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* set_file(fd, offset, stop, checksums): read the binlog file open as fd
 * from offset (up to stop, 0: its end); the table ids of a file are its own. */
static PyObject *Reader_set_file(Reader *r, PyObject *args) {
    int fd, checksums;
    long long off, stop;
    if (!PyArg_ParseTuple(args, "iLLp:set_file", &fd, &off, &stop, &checksums)) return NULL;
    if (r->mode != MODE_FILE) { PyErr_SetString(PyExc_ValueError, "set_file: not a file reader"); return NULL; }
    r->fd = fd;
    r->start = r->end = 0;
    r->read_off = r->file_off = off;
    r->stop = stop;
    r->checksums = checksums;
    r->input_done = 0;
    Py_CLEAR(r->last_rotate);
    r->last_rotate = Py_None;
    Py_INCREF(Py_None);
    clear_tables(r);
    Py_RETURN_NONE;
}

/* close(): stop reading; a read blocked on the socket returns [] (the
 * socket is shut down: a blocked poll wakes).  The socket stays the
 * library's to close. */
static PyObject *Reader_close(Reader *r, PyObject *unused) {
    r->closing = 1;
    if (r->mode == MODE_SOCKET && r->fd >= 0) shutdown(r->fd, SHUT_RDWR);
    Py_RETURN_NONE;
}

static PyObject *Reader_set_position(Reader *r, PyObject *args) {
    PyObject *file;
    long long pos;
    if (!PyArg_ParseTuple(args, "UL:set_position", &file, &pos)) return NULL;
    Py_INCREF(file);
    Py_SETREF(r->file, file);
    r->pos = pos;
    Py_RETURN_NONE;
}

static int Reader_init(Reader *r, PyObject *args, PyObject *kw) {
    static char *names[] = {"source", "mode", "checksums", "seq", "file", "pos", "kinds", "event_type",
                            "position_type", "classify", "decode_rows", "fallback", "info", "table_map", "decoders", NULL};
    PyObject *source, *file, *kinds, *event_type, *position_type, *classify, *decode_rows, *fallback, *info,
        *table_map, *decoders;
    const char *mode;
    int checksums, seq;
    long long pos;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OspiULO!O!O!OOOOO!O!:Reader", names, &source, &mode, &checksums,
                                     &seq, &file, &pos, &PyTuple_Type, &kinds, &PyType_Type, &event_type,
                                     &PyType_Type, &position_type, &classify, &decode_rows, &fallback, &info,
                                     &PyDict_Type, &table_map, &PyDict_Type, &decoders))
        return -1;
    if (PyTuple_GET_SIZE(kinds) != 256) { PyErr_SetString(PyExc_ValueError, "kinds: 256 entries"); return -1; }
    for (Py_ssize_t i = 0; i < 256; i++) {
        PyObject *k = PyTuple_GET_ITEM(kinds, i);
        if (!PyTuple_Check(k) || PyTuple_GET_SIZE(k) != 4 || !PyLong_Check(PyTuple_GET_ITEM(k, 3))) {
            PyErr_SetString(PyExc_ValueError, "kinds: (basic, name, why, how) each");
            return -1;
        }
        r->how[i] = (unsigned char)PyLong_AsLong(PyTuple_GET_ITEM(k, 3));
    }
    if (!strcmp(mode, "socket")) {
        r->mode = MODE_SOCKET;
        r->fd = PyLong_AsLong(source);
        if (r->fd < 0 && PyErr_Occurred()) return -1;
    } else if (!strcmp(mode, "socket_py")) {
        r->mode = MODE_SOCKET_PY;
        r->fd = 0;
        Py_INCREF(source);
        Py_XSETREF(r->sock, source);
    } else if (!strcmp(mode, "file")) {
        r->mode = MODE_FILE;
        r->fd = -1;  /* set_file */
    } else {
        PyErr_SetString(PyExc_ValueError, "mode: socket, socket_py or file");
        return -1;
    }
    if (!r->buf) {
        if (!(r->buf = malloc(INITIAL_CAP))) { PyErr_NoMemory(); return -1; }
        r->cap = INITIAL_CAP;
    }
    r->checksums = checksums;
    r->seq = seq & 0xFF;
    r->pos = pos;
#define KEEP(field, v) Py_INCREF(v); Py_XSETREF(r->field, v)
    KEEP(file, file);
    KEEP(kinds, kinds);
    Py_INCREF(event_type); Py_XSETREF(r->event_type, (PyTypeObject *)event_type);
    Py_INCREF(position_type); Py_XSETREF(r->position_type, (PyTypeObject *)position_type);
    KEEP(classify, classify);
    KEEP(decode_rows, decode_rows);
    KEEP(fallback, fallback);
    KEEP(info, info);
    KEEP(lib_table_map, table_map);
    KEEP(decoders, decoders);
    KEEP(post_header, Py_None);
    KEEP(last_rotate, Py_None);
#undef KEEP
    if (!r->by_body && !(r->by_body = PyDict_New())) return -1;
    if (!r->by_id && !(r->by_id = PyDict_New())) return -1;
    return 0;
}

static int Reader_traverse(Reader *r, visitproc visit, void *arg) {
    Py_VISIT(r->sock); Py_VISIT(r->file); Py_VISIT(r->last_rotate); Py_VISIT(r->by_body); Py_VISIT(r->by_id);
    Py_VISIT(r->lib_table_map); Py_VISIT(r->decoders); Py_VISIT(r->post_header); Py_VISIT(r->kinds); Py_VISIT(r->event_type);
    Py_VISIT(r->position_type); Py_VISIT(r->classify); Py_VISIT(r->decode_rows); Py_VISIT(r->fallback);
    Py_VISIT(r->info); Py_VISIT(r->last_pos_obj); Py_VISIT(r->last_pos_file);
    return 0;
}

static int Reader_clear(Reader *r) {
    Py_CLEAR(r->sock); Py_CLEAR(r->file); Py_CLEAR(r->last_rotate); Py_CLEAR(r->by_body); Py_CLEAR(r->by_id);
    Py_CLEAR(r->lib_table_map); Py_CLEAR(r->decoders); Py_CLEAR(r->post_header); Py_CLEAR(r->kinds); Py_CLEAR(r->event_type);
    Py_CLEAR(r->position_type); Py_CLEAR(r->classify); Py_CLEAR(r->decode_rows); Py_CLEAR(r->fallback);
    Py_CLEAR(r->info); Py_CLEAR(r->last_pos_obj); Py_CLEAR(r->last_pos_file);
    return 0;
}

static void Reader_dealloc(Reader *r) {
    PyObject_GC_UnTrack(r);
    Reader_clear(r);
    free(r->buf);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *get_file(Reader *r, void *c) { Py_INCREF(r->file); return r->file; }
static PyObject *get_pos(Reader *r, void *c) { return PyLong_FromLongLong(r->pos); }
static PyObject *get_last_rotate(Reader *r, void *c) { Py_INCREF(r->last_rotate); return r->last_rotate; }
static PyObject *get_post_header(Reader *r, void *c) { Py_INCREF(r->post_header); return r->post_header; }
static int set_post_header(Reader *r, PyObject *v, void *c) {
    if (!v || (v != Py_None && !PyBytes_Check(v))) { PyErr_SetString(PyExc_TypeError, "bytes or None"); return -1; }
    Py_INCREF(v);
    Py_SETREF(r->post_header, v);
    return 0;
}
static PyObject *get_checksums(Reader *r, void *c) { return PyBool_FromLong(r->checksums); }
static PyObject *get_events(Reader *r, void *c) { return PyLong_FromLongLong(r->n_events); }
static PyObject *get_handoffs(Reader *r, void *c) { return PyLong_FromLongLong(r->n_handoffs); }
static PyObject *get_buffered(Reader *r, void *c) { return PyLong_FromSsize_t(r->end - r->start); }

static PyGetSetDef Reader_getset[] = {
    {"file", (getter)get_file, NULL, "the binlog file being read", NULL},
    {"pos", (getter)get_pos, NULL, "where the next event starts", NULL},
    {"last_rotate", (getter)get_last_rotate, NULL, "the file the last ROTATE named (None: none since set_file)", NULL},
    {"post_header", (getter)get_post_header, (setter)set_post_header, "the FORMAT_DESCRIPTION's post-header lengths", NULL},
    {"checksums", (getter)get_checksums, NULL, "events end with a CRC32", NULL},
    {"events", (getter)get_events, NULL, "events read", NULL},
    {"handoffs", (getter)get_handoffs, NULL, "events handed to the Python path", NULL},
    {"buffered", (getter)get_buffered, NULL, "bytes read and not handed on yet", NULL},
    {NULL},
};

static PyMethodDef Reader_methods[] = {
    {"read", (PyCFunction)(void (*)(void))Reader_read, METH_VARARGS | METH_KEYWORDS,
     "read(max_events=256, max_rows=4096, timeout=None) -> [SourceEvent, ..., maybe a tuple]"},
    {"feed", (PyCFunction)Reader_feed, METH_VARARGS, "feed(event, checksummed) -> [item]"},
    {"remember", (PyCFunction)Reader_remember, METH_VARARGS, "remember(body, entry)"},
    {"set_file", (PyCFunction)Reader_set_file, METH_VARARGS, "set_file(fd, offset, stop, checksums)"},
    {"set_position", (PyCFunction)Reader_set_position, METH_VARARGS, "set_position(file, pos)"},
    {"close", (PyCFunction)Reader_close, METH_NOARGS, "stop reading"},
    {NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cynomys._reader.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The binlog event reader (see _reader.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_traverse = (traverseproc)Reader_traverse,
    .tp_clear = (inquiry)Reader_clear,
    .tp_methods = Reader_methods,
    .tp_getset = Reader_getset,
};

/* ---------------------------------------------------------------------- */
/* Row changes of a ROWS SourceEvent (parser/txn.py Assembler._on_rows).    */
/* ---------------------------------------------------------------------- */
/* changes(change_type, op, database, table, tid, txn, commit_ts, schema,
 * rows, which) -> [Change]: which 0: INSERT (after = first image), 1:
 * UPDATE (before, after), 2: DELETE (before = first image). */
static PyObject *changes(PyObject *self, PyObject *args) {
    PyObject *tp, *op, *database, *table, *tid, *txn, *ts, *schema, *rows;
    int which;
    if (!PyArg_ParseTuple(args, "O!OOOOOOOO!i:changes", &PyType_Type, &tp, &op, &database, &table, &tid, &txn,
                          &ts, &schema, &PyList_Type, &rows, &which))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    PyObject *out = PyList_New(n), *tmpl = PyDict_New();
    if (!out || !tmpl) goto fail;
    if (PyDict_SetItem(tmpl, S_op, op) < 0 || PyDict_SetItem(tmpl, S_database, database) < 0 ||
        PyDict_SetItem(tmpl, S_table, table) < 0 || PyDict_SetItem(tmpl, S_tid, tid) < 0 ||
        PyDict_SetItem(tmpl, S_txn, txn) < 0 || PyDict_SetItem(tmpl, S_commit_ts, ts) < 0 ||
        PyDict_SetItem(tmpl, S_schema, schema) < 0 || PyDict_SetItem(tmpl, S_before, Py_None) < 0 ||
        PyDict_SetItem(tmpl, S_after, Py_None) < 0 || PyDict_SetItem(tmpl, S_sql, Py_None) < 0)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "changes: rows are (image, image|None) pairs");
            goto fail;
        }
        PyObject *first = PyTuple_GET_ITEM(pair, 0), *second = PyTuple_GET_ITEM(pair, 1);
        PyObject *before = which == 0 ? Py_None : first;
        PyObject *after = which == 0 ? first : which == 1 ? second : Py_None;
        PyObject *d = PyDict_Copy(tmpl);
        if (!d) goto fail;
        if (PyDict_SetItem(d, S_before, before) < 0 || PyDict_SetItem(d, S_after, after) < 0) {
            Py_DECREF(d);
            goto fail;
        }
        PyObject *c = new_instance((PyTypeObject *)tp, d);
        Py_DECREF(d);
        if (!c) goto fail;
        PyList_SET_ITEM(out, i, c);
    }
    Py_DECREF(tmpl);
    return out;
fail:
    Py_XDECREF(out);
    Py_XDECREF(tmpl);
    return NULL;
}

static PyObject *crc32(PyObject *self, PyObject *args) {
    Py_buffer b;
    unsigned int start = 0;
    if (!PyArg_ParseTuple(args, "y*|I:crc32", &b, &start)) return NULL;
    uint32_t c = crc32_update(start, b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"changes", changes, METH_VARARGS, "changes(Change, op, database, table, tid, txn, commit_ts, schema, rows, which) -> [Change]"},
    {"crc32", crc32, METH_VARARGS, "crc32(data, start=0) -> int: zlib.crc32's value (for tests)"},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cynomys._reader",
                                    "The binlog event reader in C (see _reader.c).", -1, methods};

PyMODINIT_FUNC PyInit__reader(void) {
    crc_init();
    if (PyType_Ready(&ReaderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Reader", (PyObject *)&ReaderType) < 0) goto fail;
    if (!(EMPTY_TUPLE = PyTuple_New(0))) goto fail;
#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) goto fail
    INTERN(S_basic, "basic"); INTERN(S_kind, "kind"); INTERN(S_start, "start"); INTERN(S_end, "end");
    INTERN(S_timestamp, "timestamp"); INTERN(S_gtid, "gtid"); INTERN(S_standalone, "standalone");
    INTERN(S_database, "database"); INTERN(S_table, "table"); INTERN(S_sql, "sql"); INTERN(S_schema, "schema");
    INTERN(S_rows, "rows"); INTERN(S_why, "why"); INTERN(S_detail, "detail"); INTERN(S_file, "file");
    INTERN(S_pos, "pos"); INTERN(S_empty, ""); INTERN(S_recv_into, "recv_into"); INTERN(S_op, "op");
    INTERN(S_tid, "tid"); INTERN(S_txn, "txn"); INTERN(S_commit_ts, "commit_ts"); INTERN(S_before, "before");
    INTERN(S_after, "after"); INTERN(S_handoff, "handoff"); INTERN(S_error, "error");
    INTERN(S_server_error, "server_error"); INTERN(S_eof, "eof"); INTERN(S_file_end, "file_end");
#undef INTERN
    /* SourceEvent's fields and defaults (parser/stream.py); rows is set per event. */
    if (!(EVENT_TEMPLATE = PyDict_New()) || !(POSITION_TEMPLATE = PyDict_New())) goto fail;
    PyObject *keys[] = {S_basic, S_kind, S_start, S_end, S_timestamp, S_gtid, S_standalone, S_database, S_table,
                        S_sql, S_schema, S_rows, S_why, S_detail};
    PyObject *dflt[] = {Py_None, Py_None, Py_None, Py_None, Py_None, S_empty, Py_False, S_empty, S_empty,
                        S_empty, Py_None, Py_None, S_empty, Py_None};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (PyDict_SetItem(EVENT_TEMPLATE, keys[i], dflt[i]) < 0) goto fail;
    if (PyDict_SetItem(POSITION_TEMPLATE, S_file, S_empty) < 0 || PyDict_SetItem(POSITION_TEMPLATE, S_pos, Py_None) < 0 ||
        PyDict_SetItem(POSITION_TEMPLATE, S_gtid, S_empty) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
