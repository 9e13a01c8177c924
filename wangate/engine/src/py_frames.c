/* Python-level functions over wg_frames.h, for tests and diagnostics.
 *
 * Bad arguments raise ValueError or TypeError; malformed frames (the peer's bytes)
 * raise RemoteProtocolError. */
#include "wg_py.h"

#include "wg_frames.h"

/* a Python int 0 .. WG_VARINT_MAX, or an exception naming `what` */
static int varint_arg(PyObject *obj, const char *what, uint64_t *out) {
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow != 0 || v < 0 || (unsigned long long)v > WG_VARINT_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "%s must be 0 .. 2**62 - 1 (a QUIC varint, RFC 9000 section 16)", what);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

static PyObject *py_encode_varint(PyObject *self, PyObject *arg) {
    uint64_t v;
    if (varint_arg(arg, "value", &v) < 0) return NULL;
    uint8_t buf[8];
    size_t n = wg_varint_put(buf, sizeof buf, v);
    return PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)n);
}

static PyObject *py_decode_varint(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*:decode_varint", &data)) return NULL;
    uint64_t v = 0;
    size_t n = wg_varint_get(data.buf, (size_t)data.len, &v);
    PyBuffer_Release(&data);
    if (n == 0) {
        PyErr_SetString(wg_RemoteProtocolError, "truncated varint (RFC 9000 §16)");
        return NULL;
    }
    return Py_BuildValue("(Kn)", (unsigned long long)v, (Py_ssize_t)n);
}

/* the largest an ACK frame gets: type, 3 varints, and WG_MAX_ACK_RANGES ranges */
#define ACK_MAX_BYTES (1 + 4 * 8 + 2 * 8 * WG_MAX_ACK_RANGES)

static PyObject *py_encode_ack(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"ranges", "ack_delay", "cap", NULL};
    PyObject *ranges, *delay_obj;
    Py_ssize_t cap = ACK_MAX_BYTES;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|n:encode_ack", kwlist, &ranges, &delay_obj,
                                     &cap))
        return NULL;
    wg_ack ack = {0};
    if (varint_arg(delay_obj, "ack_delay", &ack.ack_delay) < 0) return NULL;
    PyObject *seq = PySequence_Fast(ranges, "ranges must be a sequence of (smallest, largest)");
    if (seq == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count < 1 || count > WG_MAX_ACK_RANGES) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "an ACK frame has 1 to %d ranges, not %zd",
                     WG_MAX_ACK_RANGES, count);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "each range is a tuple (smallest, largest)");
            return NULL;
        }
        if (varint_arg(PyTuple_GET_ITEM(item, 0), "smallest", &ack.ranges[i].smallest) < 0 ||
            varint_arg(PyTuple_GET_ITEM(item, 1), "largest", &ack.ranges[i].largest) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    ack.count = (size_t)count;
    for (size_t i = 0; i < ack.count; i++) {
        const wg_ack_range *r = &ack.ranges[i];
        if (r->smallest > r->largest) {
            PyErr_Format(PyExc_ValueError, "range %zu: smallest %llu above largest %llu", i,
                         (unsigned long long)r->smallest, (unsigned long long)r->largest);
            return NULL;
        }
        const wg_ack_range *prev = i > 0 ? &ack.ranges[i - 1] : NULL;
        if (prev != NULL && (prev->smallest < 2 || r->largest > prev->smallest - 2)) {
            PyErr_Format(PyExc_ValueError,
                         "range %zu: ranges go highest first with at least one packet number "
                         "between them (RFC 9000 section 19.3.1)", i);
            return NULL;
        }
    }
    if (cap < 0) {
        PyErr_SetString(PyExc_ValueError, "cap is not negative");
        return NULL;
    }
    uint8_t buf[ACK_MAX_BYTES];
    size_t n = wg_ack_encode(&ack, buf, cap < ACK_MAX_BYTES ? (size_t)cap : ACK_MAX_BYTES);
    if (n == 0) {
        PyErr_Format(PyExc_ValueError, "not even one range of the ACK fits in %zd bytes", cap);
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)n);
}

static PyObject *parsed_to_dict(const wg_parsed *parsed, const uint8_t *data) {
    PyObject *ack = Py_None, *datagrams = NULL, *dict = NULL;
    Py_INCREF(Py_None);
    if (parsed->has_ack) {
        PyObject *ranges = PyList_New((Py_ssize_t)parsed->ack.count);
        if (ranges == NULL) goto fail;
        for (size_t i = 0; i < parsed->ack.count; i++) {
            PyObject *r = Py_BuildValue("(KK)", (unsigned long long)parsed->ack.ranges[i].smallest,
                                        (unsigned long long)parsed->ack.ranges[i].largest);
            if (r == NULL) {
                Py_DECREF(ranges);
                goto fail;
            }
            PyList_SET_ITEM(ranges, (Py_ssize_t)i, r);
        }
        Py_DECREF(ack);
        ack = Py_BuildValue("{sKsN}", "ack_delay", (unsigned long long)parsed->ack.ack_delay,
                            "ranges", ranges);
        if (ack == NULL) goto fail;
    }
    datagrams = PyList_New((Py_ssize_t)parsed->datagram_count);
    if (datagrams == NULL) goto fail;
    for (size_t i = 0; i < parsed->datagram_count; i++) {
        PyObject *d = PyBytes_FromStringAndSize((const char *)data + parsed->datagram_off[i],
                                                (Py_ssize_t)parsed->datagram_len[i]);
        if (d == NULL) goto fail;
        PyList_SET_ITEM(datagrams, (Py_ssize_t)i, d);
    }
    dict = Py_BuildValue("{sOsOsO}", "ack_eliciting", parsed->ack_eliciting ? Py_True : Py_False,
                         "ack", ack, "datagrams", datagrams);
fail:
    Py_XDECREF(ack);
    Py_XDECREF(datagrams);
    return dict;
}

static PyObject *py_parse_frames(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*:parse_frames", &data)) return NULL;
    wg_parsed parsed;
    PyObject *out = NULL;
    if (wg_frames_parse(data.buf, (size_t)data.len, &parsed) < 0)
        PyErr_SetString(wg_RemoteProtocolError,
                        "malformed frames: empty, truncated, an unknown frame type, an ACK "
                        "below packet number 0, a second ACK or over 16 DATAGRAM frames");
    else
        out = parsed_to_dict(&parsed, data.buf);
    PyBuffer_Release(&data);
    return out;
}

PyMethodDef wg_py_frames_methods[] = {
    {"encode_varint", py_encode_varint, METH_O,
     "encode_varint(value) -> bytes\n\nThe shortest QUIC varint for value (RFC 9000 §16)."},
    {"decode_varint", py_decode_varint, METH_VARARGS,
     "decode_varint(data) -> (value, length)\n\nThe varint at the start of data."},
    {"encode_ack", (PyCFunction)(void (*)(void))py_encode_ack, METH_VARARGS | METH_KEYWORDS,
     "encode_ack(ranges, ack_delay, cap=...) -> bytes\n\n"
     "An ACK frame (0x02, RFC 9000 §19.3) of ranges [(smallest, largest), ...], highest\n"
     "first; the lowest ranges are left off when the frame would not fit cap bytes."},
    {"parse_frames", py_parse_frames, METH_VARARGS,
     "parse_frames(data) -> {'ack_eliciting': bool, 'ack': None or {'ack_delay': int,\n"
     "'ranges': [(smallest, largest), ...]}, 'datagrams': [bytes, ...]}\n\n"
     "A packet's frames; RemoteProtocolError when they are malformed."},
    {NULL, NULL, 0, NULL},
};
