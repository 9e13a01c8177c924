/* place_shards: a received batch's usual shards written into their messages' bodies in
 * one call, and summarised as runs (proto/wire.md, "Datagrams"; wangate/core/session.py
 * handles the runs).
 *
 * A shard is taken here when it has the usual encoding (4-byte msg_len and offset,
 * both varints), does not start its message (offset 0 says where the payload begins,
 * and is the sender's "done?"), belongs to a message in `bodies` (admitted, no FEC
 * repair so far; one of the first MAX_BODIES the batch writes into) whose size it
 * matches, and lies inside it. Everything else, malformed
 * datagrams included, comes back as it came, in place, for the session's per-datagram
 * path, which gives the same errors as ever. Consecutive taken shards of one message
 * whose offsets and path sequence numbers both follow on are one run:
 *
 *   (msg_id, msg_len, start, end, seq_first, seq_last, count, size_bytes, critical,
 *    stamp_first, stamp_last, jitter_s)
 *
 * seq and msg_id expanded as the session would (RFC 9000 Appendix A.3), size_bytes the
 * datagrams' whole lengths, jitter_s the RFC 3550 §6.4.1 filter run over the run's
 * transit times from 0 after its first datagram (all share one arrival time, so their
 * differences are the send stamps'): the session folds it into the path's jitter.
 *
 * The payload copies are made with the GIL released, after every check. */
#include "py_read.h"
#include "wg_py.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DGRAM_TYPE_MASK 0xC0
#define DGRAM_SHARD 0x40
#define DGRAM_REPAIR 0x80
#define MAX_REPAIRED 64 /* messages a batch's repair symbols take off the fast path */
#define MAX_BODIES 32   /* bodies one batch writes into; shards of more are the session's */
#define FLAG_CRITICAL 0x01
#define USUAL_HEADER_BYTES 20 /* type u8, seq u32, stamp u24, msg_id u32, 2 x varint4 */
#define VARINT4_MASK 0x3FFFFFFFu
#define STAMP_BITS 24
#define STAMP_UNIT_S 4e-6
#define EXPANDABLE_MAX (1ULL << 62) /* seq and msg_id above this: no fast path */

/* the value nearest `expected` whose low `bits` are `truncated` (RFC 9000 Appendix A.3);
 * expected < 2^62 + 1, so nothing overflows */
static uint64_t expand(uint64_t truncated, unsigned bits, uint64_t expected) {
    uint64_t window = 1ULL << bits, half = window >> 1;
    uint64_t candidate = (expected & ~(window - 1)) | truncated;
    if (candidate + half <= expected && candidate < (uint64_t)0 - window) return candidate + window;
    if (candidate > expected + half && candidate >= window) return candidate - window;
    return candidate;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* stamp b minus stamp a, in units, as the nearest signed difference (they wrap) */
static int32_t stamp_diff(uint32_t a, uint32_t b) {
    int32_t d = (int32_t)((b - a) & ((1u << STAMP_BITS) - 1));
    return d >= (1 << (STAMP_BITS - 1)) ? d - (1 << STAMP_BITS) : d;
}

typedef struct {
    uint64_t msg_id, msg_len, start, end, seq_first, seq_last, count, size_bytes;
    uint32_t stamp_first, stamp_last;
    int critical;
    double jitter_s;
} run_t;

typedef struct {
    uint8_t *dst;
    const uint8_t *src; /* in `item`, or in the read that `datagrams` names */
    size_t len;
    PyObject *item; /* a list's bytes object, referenced until the copy is made */
} copy_t;

static int append_run(PyObject *out, const run_t *r) {
    PyObject *t = Py_BuildValue(
        "(KKKKKKKKOIId)", (unsigned long long)r->msg_id, (unsigned long long)r->msg_len,
        (unsigned long long)r->start, (unsigned long long)r->end,
        (unsigned long long)r->seq_first, (unsigned long long)r->seq_last,
        (unsigned long long)r->count, (unsigned long long)r->size_bytes,
        r->critical ? Py_True : Py_False, (unsigned int)r->stamp_first,
        (unsigned int)r->stamp_last, r->jitter_s);
    if (t == NULL) return -1;
    int rc = PyList_Append(out, t);
    Py_DECREF(t);
    return rc;
}

/* a Python int 0 .. 2^62 (else -1 without an exception: no fast path) */
static int expandable_arg(PyObject *obj, const char *what, uint64_t *out) {
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(obj)->tp_name);
        return -2;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) return -2;
    if (overflow != 0 || v < 0 || (unsigned long long)v >= EXPANDABLE_MAX) return -1;
    *out = (uint64_t)v;
    return 0;
}

/* what place_shards gives back when it takes nothing: a list as it came, a
 * ReadDatagrams' frames as bytes */
static PyObject *as_list(PyObject *datagrams) {
    if (PyList_Check(datagrams)) {
        Py_INCREF(datagrams);
        return datagrams;
    }
    const uint8_t *base;
    const uint32_t *offsets, *lengths;
    Py_ssize_t n = wg_py_datagrams_view(datagrams, &base, &offsets, &lengths);
    if (n < 0) return NULL;
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *d = PyBytes_FromStringAndSize((const char *)base + offsets[i], lengths[i]);
        if (d == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, d);
    }
    return out;
}

static PyObject *py_place_shards(PyObject *self, PyObject *args) {
    PyObject *datagrams, *bodies, *newest_obj, *largest_obj;
    if (!PyArg_ParseTuple(args, "OO!OO:place_shards", &datagrams, &PyDict_Type, &bodies,
                          &newest_obj, &largest_obj))
        return NULL;
    /* a list of bytes, or the frames of a read where they lie (no bytes object each) */
    const uint8_t *base = NULL;
    const uint32_t *offsets = NULL, *lengths = NULL;
    Py_ssize_t n;
    if (PyList_Check(datagrams)) {
        n = PyList_GET_SIZE(datagrams);
    } else if (Py_IS_TYPE(datagrams, &wg_ReadDatagramsType)) {
        if ((n = wg_py_datagrams_view(datagrams, &base, &offsets, &lengths)) < 0) return NULL;
    } else {
        PyErr_Format(PyExc_TypeError, "datagrams must be a list or ReadDatagrams, not %.100s",
                     Py_TYPE(datagrams)->tp_name);
        return NULL;
    }
    uint64_t newest_seq, largest_msg_id;
    int a = expandable_arg(newest_obj, "newest_seq", &newest_seq);
    int b = a == -2 ? -2 : expandable_arg(largest_obj, "largest_msg_id", &largest_msg_id);
    if (a == -2 || b == -2) return NULL;
    if (a < 0 || b < 0 || n == 0 || PyDict_GET_SIZE(bodies) == 0)
        return as_list(datagrams); /* nothing can be taken: all of it per datagram */
    /* the sources stay referenced while the GIL is released (a list is the caller's and
     * could change meanwhile; the caller's ReadDatagrams keeps its reader, and so the
     * read, alive: a reader is read from one thread, its event loop's), and the bodies'
     * buffers stay exported */
    copy_t *copies = PyMem_Malloc((size_t)n * sizeof(copy_t));
    PyObject *out = PyList_New(0);
    if (copies == NULL || out == NULL) {
        PyMem_Free(copies);
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    Py_buffer views[MAX_BODIES];
    uint64_t view_ids[MAX_BODIES];
    Py_ssize_t ncopies = 0, nviews = 0;
    int failed = 0;
    run_t run = {0};
    int in_run = 0;
    uint64_t cur_id = 0; /* the message `cur` is the body of (0: none looked up) */
    Py_buffer *cur = NULL;
    int looked_up = 0; /* in `bodies`, for cur_id (cur NULL after: it has none) */
    /* The session expands the truncated fields of the datagrams left to it against what
     * it has seen by then, and those may move what it has seen: the newest sequence
     * number (if accepted) and the largest message id (if decoded). Here that is known
     * only to lie between what the taken shards make it (lo) and what every datagram
     * left to the session could make it (hi); expansion is monotonic in what it is
     * against, so a shard whose fields expand alike against both is expanded as the
     * session would, and any other is left to the session. */
    uint64_t seq_lo = newest_seq, seq_hi = newest_seq, id_lo = largest_msg_id,
             id_hi = largest_msg_id;
    int opaque = 0; /* an item that is not bytes came: what it does is unknown */
    /* A repair symbol gives its message FEC state the session keeps per datagram: the
     * message's later shards in this batch are the session's (low 32 bits of its id). */
    uint32_t repaired[MAX_REPAIRED];
    int nrepaired = 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        PyObject *item = NULL; /* a list's; a read's frames have none */
        const uint8_t *p = NULL;
        Py_ssize_t len = 0;
        if (base != NULL) {
            p = base + offsets[i];
            len = lengths[i];
        } else if (PyBytes_CheckExact(item = PyList_GET_ITEM(datagrams, i))) {
            p = (const uint8_t *)PyBytes_AS_STRING(item);
            len = PyBytes_GET_SIZE(item);
        } else {
            opaque = 1;
        }
        int usual = !opaque && len > USUAL_HEADER_BYTES &&
                    (p[0] & DGRAM_TYPE_MASK) == DGRAM_SHARD && p[12] >> 6 == 2 && p[16] >> 6 == 2;
        uint64_t seq = 0, msg_id = 0, msg_len = 0, offset = 0, end = 0;
        uint32_t stamp = 0;
        for (int r = 0; usual && r < nrepaired; r++) usual = repaired[r] != be32(p + 8);
        if (usual) {
            msg_len = be32(p + 12) & VARINT4_MASK;
            offset = be32(p + 16) & VARINT4_MASK;
            msg_id = expand(be32(p + 8), 32, id_lo + 1);
            seq = expand(be32(p + 1), 32, seq_lo + 1);
            end = offset + (uint64_t)(len - USUAL_HEADER_BYTES);
            usual = offset > 0 && msg_id != 0 && end <= msg_len &&
                    msg_id == expand(be32(p + 8), 32, id_hi + 1) &&
                    seq == expand(be32(p + 1), 32, seq_hi + 1);
        }
        if (usual && msg_id != cur_id) {
            cur_id = msg_id;
            cur = NULL;
            looked_up = 0;
            for (Py_ssize_t v = 0; v < nviews && cur == NULL; v++)
                if (view_ids[v] == msg_id) cur = &views[v], looked_up = 1;
        }
        if (usual && !looked_up && nviews < MAX_BODIES) {
            looked_up = 1;
            PyObject *key = PyLong_FromUnsignedLongLong(msg_id);
            if (key == NULL) {
                failed = 1;
                break;
            }
            PyObject *body = PyDict_GetItemWithError(bodies, key); /* borrowed */
            Py_DECREF(key);
            if (body == NULL && PyErr_Occurred()) {
                failed = 1;
                break;
            }
            if (body != NULL) {
                if (PyObject_GetBuffer(body, &views[nviews], PyBUF_WRITABLE) < 0) {
                    failed = 1;
                    break;
                }
                view_ids[nviews] = msg_id;
                cur = &views[nviews++];
            }
        }
        usual = usual && cur != NULL && (uint64_t)cur->len == msg_len;
        if (!usual) {
            if (p != NULL && len >= 5) { /* long enough to carry a sequence number */
                uint64_t v = expand(be32(p + 1), 32, seq_hi + 1);
                if (v > seq_hi) seq_hi = v;
            }
            if (p != NULL && len >= 12) { /* and a message id */
                uint64_t v = expand(be32(p + 8), 32, id_hi + 1);
                if (v > id_hi) id_hi = v;
                if ((p[0] & DGRAM_TYPE_MASK) == DGRAM_REPAIR) {
                    if (nrepaired < MAX_REPAIRED)
                        repaired[nrepaired++] = be32(p + 8);
                    else
                        opaque = 1;
                }
            }
            if (in_run && append_run(out, &run) < 0) failed = 1;
            in_run = 0;
            if (!failed) { /* as it came: a read's frame as bytes */
                PyObject *left = item != NULL ? Py_NewRef(item)
                                              : PyBytes_FromStringAndSize((const char *)p, len);
                if (left == NULL || PyList_Append(out, left) < 0) failed = 1;
                Py_XDECREF(left);
            }
            continue;
        }
        stamp = (uint32_t)p[5] << 16 | (uint32_t)p[6] << 8 | p[7];
        int critical = p[0] & FLAG_CRITICAL;
        if (in_run && run.msg_id == msg_id && run.end == offset && run.seq_last + 1 == seq &&
            run.critical == critical) {
            /* the next transit time differs from the last by minus the stamps' */
            double d_s = fabs((double)stamp_diff(run.stamp_last, stamp)) * STAMP_UNIT_S;
            run.jitter_s += (d_s - run.jitter_s) / 16;
            run.end = end;
            run.seq_last = seq;
            run.count++;
            run.size_bytes += (uint64_t)len;
            run.stamp_last = stamp;
        } else {
            if (in_run && append_run(out, &run) < 0) {
                failed = 1;
                break;
            }
            run = (run_t){msg_id, msg_len, offset, end, seq, seq, 1, (uint64_t)len,
                          stamp, stamp, critical, 0.0};
            in_run = 1;
        }
        if (seq > seq_lo) seq_lo = seq;
        if (seq > seq_hi) seq_hi = seq;
        if (msg_id > id_lo) id_lo = msg_id;
        if (msg_id > id_hi) id_hi = msg_id;
        Py_XINCREF(item);
        copies[ncopies++] = (copy_t){(uint8_t *)cur->buf + offset, p + USUAL_HEADER_BYTES,
                                     (size_t)(end - offset), item};
    }
    if (!failed && in_run && append_run(out, &run) < 0) failed = 1;
    if (!failed) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < ncopies; i++) memcpy(copies[i].dst, copies[i].src, copies[i].len);
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t i = 0; i < ncopies; i++) Py_XDECREF(copies[i].item);
    for (Py_ssize_t i = 0; i < nviews; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(copies);
    if (failed) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* ShardSpan fields, in order (wangate/core/datagrams.py) */
static const char *const span_fields[] = {"payload_base", "seq_first", "stamp", "msg_id",
                                          "msg_len", "start", "end", "stride"};
#define SPAN_ITEMS 10

int wg_py_span_parse(PyObject *item, wg_span *s, Py_buffer *view, size_t *count,
                     size_t *longest) {
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != SPAN_ITEMS) {
        PyErr_Format(PyExc_TypeError, "a ShardSpan of %d items is needed, not %.100s",
                     SPAN_ITEMS, Py_TYPE(item)->tp_name);
        return -1;
    }
    uint64_t v[8];
    for (int i = 0; i < 8; i++) {
        PyObject *obj = PyTuple_GET_ITEM(item, i + 1);
        if (!PyLong_Check(obj)) {
            PyErr_Format(PyExc_TypeError, "ShardSpan.%s must be an int, not %.100s",
                         span_fields[i], Py_TYPE(obj)->tp_name);
            return -1;
        }
        v[i] = PyLong_AsUnsignedLongLong(obj);
        if (v[i] == (uint64_t)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(wg_LocalProtocolError, "ShardSpan.%s %R is not a 64-bit unsigned int",
                         span_fields[i], obj);
            return -1;
        }
    }
    int critical = PyObject_IsTrue(PyTuple_GET_ITEM(item, 9));
    if (critical < 0) return -1;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 0), view, PyBUF_SIMPLE) < 0) return -1;
    *s = (wg_span){(const uint8_t *)view->buf, (size_t)view->len, v[0], v[1], v[2],
                   v[3], v[4], v[5], v[6], v[7], critical};
    const char *why = NULL;
    if (wg_span_check(s, count, longest, &why) < 0) {
        PyBuffer_Release(view);
        PyErr_SetString(wg_LocalProtocolError, why);
        return -1;
    }
    return 0;
}

static PyObject *py_encode_shard_span(PyObject *self, PyObject *arg) {
    wg_span span;
    Py_buffer view;
    size_t count, longest;
    if (wg_py_span_parse(arg, &span, &view, &count, &longest) < 0) return NULL;
    PyObject *out = PyList_New((Py_ssize_t)count);
    for (size_t i = 0; out != NULL && i < count; i++) {
        /* each datagram written straight into its bytes object, then cut to its length */
        PyObject *datagram = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)longest);
        if (datagram == NULL) {
            Py_CLEAR(out);
            break;
        }
        size_t len = wg_span_write(&span, i, (uint8_t *)PyBytes_AS_STRING(datagram));
        if (_PyBytes_Resize(&datagram, (Py_ssize_t)len) < 0) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, datagram);
    }
    PyBuffer_Release(&view);
    return out;
}

PyMethodDef wg_py_shards_methods[] = {
    {"encode_shard_span", py_encode_shard_span, METH_O,
     "encode_shard_span(span) -> list[bytes]: a ShardSpan's datagrams, each as encode_shard "
     "frames it (see wg_span.h)"},
    {"place_shards", py_place_shards, METH_VARARGS,
     "place_shards(datagrams, bodies, newest_seq, largest_msg_id) -> list: the batch with "
     "its usual shards of the messages in `bodies` (msg_id -> writable body) copied in "
     "place and summarised as runs; everything else as it came (see py_shards.c)"},
    {NULL, NULL, 0, NULL},
};
