/* Python types over wg_recovery and wg_received, for the tests: Recovery speaks
 * aioquic's QuicPacketRecovery's terms (tests/test_engine_recovery.py drives both
 * side by side), Received those of what a channel has received
 * (tests/test_engine_received.py).  Misuse raises LocalProtocolError; an ACK of a
 * packet never sent raises RemoteProtocolError, as the channel closes on it. */
#include "wg_py.h" /* Python.h first */

#include <math.h>
#include "wg_received.h"
#include "wg_recovery.h"

#define PN_MAX (((uint64_t)1 << 62) - 1) /* RFC 9000 §12.3 */

/* a packet number from a Python int: 0 .. 2^62 - 1, else LocalProtocolError */
static int get_pn(PyObject *obj, uint64_t *pn) {
    if (!PyLong_Check(obj)) {
        PyErr_SetString(wg_LocalProtocolError, "a packet number is an int");
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < 0 || (uint64_t)v > PN_MAX) {
        PyErr_SetString(wg_LocalProtocolError, "a packet number is 0 .. 2**62 - 1");
        return -1;
    }
    *pn = (uint64_t)v;
    return 0;
}

static int check_time(double t, const char *what) {
    if (!isfinite(t)) {
        PyErr_Format(wg_LocalProtocolError, "%s must be finite", what);
        return -1;
    }
    return 0;
}

static PyObject *time_or_none(double t) {
    if (t < 0) Py_RETURN_NONE;
    return PyFloat_FromDouble(t);
}

/* ------------------------------------------------------------------ Recovery */

typedef struct {
    PyObject_HEAD
    wg_recovery r;
    int ready;
    PyObject *lost;  /* list: packet numbers lost in the last call */
    PyObject *acked; /* list: packet numbers acked by the last on_ack_received */
    int callback_failed;
    wg_recovery_report report;
} RecoveryObject;

static void note_pn(RecoveryObject *self, PyObject *list, uint64_t pn) {
    if (self->callback_failed || list == NULL) return;
    PyObject *v = PyLong_FromUnsignedLongLong(pn);
    if (v == NULL || PyList_Append(list, v) < 0) self->callback_failed = 1;
    Py_XDECREF(v);
}

static void on_lost(void *ctx, uint64_t pn, const wg_sent *packet) {
    RecoveryObject *self = ctx;
    note_pn(self, self->lost, pn);
}

static void on_acked(void *ctx, uint64_t pn, const wg_sent *packet) {
    RecoveryObject *self = ctx;
    note_pn(self, self->acked, pn);
}

/* fresh lists for a call's lost and acked packets */
static int start_call(RecoveryObject *self) {
    PyObject *lost = PyList_New(0), *acked = PyList_New(0);
    if (lost == NULL || acked == NULL) {
        Py_XDECREF(lost);
        Py_XDECREF(acked);
        return -1;
    }
    Py_XSETREF(self->lost, lost);
    Py_XSETREF(self->acked, acked);
    self->callback_failed = 0;
    return 0;
}

static int Recovery_init(RecoveryObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"max_datagram_size", "initial_rtt_s", "max_ack_delay_s",
                             "ring_cap", "ring_max", NULL};
    Py_ssize_t size, ring_cap = 0, ring_max = (Py_ssize_t)WG_RECOVERY_RING_MAX;
    double initial_rtt, max_ack_delay;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ndd|nn", kwlist, &size, &initial_rtt,
                                     &max_ack_delay, &ring_cap, &ring_max))
        return -1;
    if (size < 1200 || size > 65527) {
        PyErr_SetString(wg_LocalProtocolError, "max_datagram_size must be 1200 .. 65527");
        return -1;
    }
    if (!(initial_rtt > 0) || !isfinite(initial_rtt) || !(max_ack_delay >= 0) ||
        !isfinite(max_ack_delay)) {
        PyErr_SetString(wg_LocalProtocolError, "initial_rtt_s > 0 and max_ack_delay_s >= 0");
        return -1;
    }
    if (ring_cap < 0 || ring_max < 1 || (size_t)ring_max > WG_RECOVERY_RING_MAX ||
        (ring_max & (ring_max - 1)) != 0) {
        PyErr_SetString(wg_LocalProtocolError,
                        "ring_cap >= 0, ring_max a power of two up to WG_RECOVERY_RING_MAX");
        return -1;
    }
    if (self->ready) wg_recovery_free(&self->r);
    self->ready = 0;
    if ((size_t)ring_cap > (size_t)ring_max) ring_cap = ring_max;
    if (wg_recovery_init(&self->r, (size_t)ring_cap, (size_t)size, initial_rtt,
                         max_ack_delay) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    if (self->r.ring_cap > (size_t)ring_max) {
        wg_recovery_free(&self->r);
        PyErr_SetString(wg_LocalProtocolError, "ring_cap rounds up beyond ring_max");
        return -1;
    }
    self->r.ring_max = (size_t)ring_max;
    self->r.on_lost = on_lost;
    self->r.on_lost_ctx = self;
    self->r.on_acked = on_acked;
    self->r.on_acked_ctx = self;
    self->ready = 1;
    return start_call(self);
}

static void Recovery_dealloc(RecoveryObject *self) {
    if (self->ready) wg_recovery_free(&self->r);
    Py_XDECREF(self->lost);
    Py_XDECREF(self->acked);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ready(RecoveryObject *self) {
    if (!self->ready) {
        PyErr_SetString(wg_LocalProtocolError, "Recovery was not initialized");
        return 0;
    }
    return 1;
}

static PyObject *Recovery_on_packet_sent(RecoveryObject *self, PyObject *args) {
    Py_ssize_t bytes;
    int ack_eliciting;
    double now;
    if (!ready(self) || !PyArg_ParseTuple(args, "npd", &bytes, &ack_eliciting, &now))
        return NULL;
    if (check_time(now, "now") < 0) return NULL;
    if (bytes < 1 || bytes > 65527) {
        PyErr_SetString(wg_LocalProtocolError, "sent_bytes must be 1 .. 65527");
        return NULL;
    }
    int64_t pn = wg_recovery_on_sent(&self->r, (size_t)bytes, ack_eliciting, self->r.next_pn, now);
    if (pn < 0) {
        PyErr_SetString(wg_LocalProtocolError, "the ring of sent packets is full");
        return NULL;
    }
    return PyLong_FromLongLong(pn);
}

static int cmp_range_desc(const void *a, const void *b) {
    const wg_ack_range *x = a, *y = b;
    return x->smallest < y->smallest ? 1 : x->smallest > y->smallest ? -1 : 0;
}

/* (smallest, largest) pairs in any order, overlapping or adjacent ones merged as
 * aioquic's RangeSet does, into *ack highest first */
static int parse_ranges(PyObject *ranges, wg_ack *ack) {
    PyObject *seq = PySequence_Fast(ranges, "ranges is a sequence of (smallest, largest)");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1) {
        Py_DECREF(seq);
        PyErr_SetString(wg_LocalProtocolError, "an ACK has at least one range");
        return -1;
    }
    wg_ack_range *all = PyMem_Calloc((size_t)n, sizeof *all);
    if (all == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    int rc = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(wg_LocalProtocolError, "a range is (smallest, largest)");
            goto done;
        }
        if (get_pn(PyTuple_GET_ITEM(item, 0), &all[i].smallest) < 0 ||
            get_pn(PyTuple_GET_ITEM(item, 1), &all[i].largest) < 0)
            goto done;
        if (all[i].smallest > all[i].largest) {
            PyErr_SetString(wg_LocalProtocolError, "a range's smallest is above its largest");
            goto done;
        }
    }
    qsort(all, (size_t)n, sizeof *all, cmp_range_desc);
    ack->count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ack->count > 0 && all[i].largest + 1 >= ack->ranges[ack->count - 1].smallest) {
            wg_ack_range *last = &ack->ranges[ack->count - 1];
            last->smallest = all[i].smallest;
            if (all[i].largest > last->largest) last->largest = all[i].largest;
            continue;
        }
        if (ack->count == WG_MAX_ACK_RANGES) {
            PyErr_SetString(wg_LocalProtocolError, "more ranges than an ACK frame holds");
            goto done;
        }
        ack->ranges[ack->count++] = all[i];
    }
    rc = 0;
done:
    PyMem_Free(all);
    Py_DECREF(seq);
    return rc;
}

/* the lost list, or NULL if a callback could not record */
static PyObject *finish_call(RecoveryObject *self) {
    if (self->callback_failed) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return NULL;
    }
    return Py_NewRef(self->lost);
}

static PyObject *Recovery_on_ack_received(RecoveryObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"ranges", "ack_delay_s", "now", NULL};
    PyObject *ranges;
    double ack_delay, now;
    if (!ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "Odd", kwlist, &ranges, &ack_delay, &now))
        return NULL;
    if (check_time(now, "now") < 0 || check_time(ack_delay, "ack_delay_s") < 0) return NULL;
    if (ack_delay < 0) {
        PyErr_SetString(wg_LocalProtocolError, "ack_delay_s must be >= 0");
        return NULL;
    }
    wg_ack ack;
    memset(&ack, 0, sizeof ack);
    if (parse_ranges(ranges, &ack) < 0 || start_call(self) < 0) return NULL;
    if (wg_recovery_on_ack(&self->r, &ack, ack_delay, now, &self->report) < 0) {
        PyErr_SetString(wg_RemoteProtocolError, "ACK of a packet never sent");
        return NULL;
    }
    return finish_call(self);
}

static PyObject *Recovery_get_loss_detection_time(RecoveryObject *self, PyObject *unused) {
    if (!ready(self)) return NULL;
    return time_or_none(wg_recovery_timer(&self->r));
}

static PyObject *Recovery_get_probe_timeout(RecoveryObject *self, PyObject *unused) {
    if (!ready(self)) return NULL;
    return PyFloat_FromDouble(wg_recovery_pto_s(&self->r));
}

static PyObject *Recovery_on_loss_detection_timeout(RecoveryObject *self, PyObject *args) {
    double now;
    if (!ready(self) || !PyArg_ParseTuple(args, "d", &now)) return NULL;
    if (check_time(now, "now") < 0 || start_call(self) < 0) return NULL;
    int probes = wg_recovery_on_timer(&self->r, now, &self->report);
    if (self->callback_failed) return finish_call(self);
    return PyLong_FromLong(probes);
}

static PyObject *Recovery_can_send(RecoveryObject *self, PyObject *args) {
    Py_ssize_t bytes;
    if (!ready(self) || !PyArg_ParseTuple(args, "n", &bytes)) return NULL;
    if (bytes < 0) {
        PyErr_SetString(wg_LocalProtocolError, "bytes must be >= 0");
        return NULL;
    }
    return PyBool_FromLong(wg_recovery_can_send(&self->r, (size_t)bytes));
}

static PyObject *Recovery_pacer_next_send_time(RecoveryObject *self, PyObject *args) {
    double now;
    if (!ready(self) || !PyArg_ParseTuple(args, "d", &now)) return NULL;
    return time_or_none(wg_pacer_next_send_time(&self->r.pacer, now));
}

static PyObject *Recovery_pacer_update_after_send(RecoveryObject *self, PyObject *args) {
    double now;
    if (!ready(self) || !PyArg_ParseTuple(args, "d", &now)) return NULL;
    wg_pacer_update_after_send(&self->r.pacer, now);
    Py_RETURN_NONE;
}

static PyMethodDef Recovery_methods[] = {
    {"on_packet_sent", (PyCFunction)Recovery_on_packet_sent, METH_VARARGS,
     "on_packet_sent(sent_bytes, ack_eliciting, now) -> packet number"},
    {"on_ack_received", (PyCFunction)(void (*)(void))Recovery_on_ack_received,
     METH_VARARGS | METH_KEYWORDS,
     "on_ack_received(ranges, ack_delay_s, now) -> packet numbers newly lost "
     "(those newly acked: .acked)"},
    {"get_loss_detection_time", (PyCFunction)Recovery_get_loss_detection_time, METH_NOARGS,
     "the loss-detection timer, or None"},
    {"get_probe_timeout", (PyCFunction)Recovery_get_probe_timeout, METH_NOARGS,
     "the PTO period without backoff"},
    {"on_loss_detection_timeout", (PyCFunction)Recovery_on_loss_detection_timeout,
     METH_VARARGS, "on_loss_detection_timeout(now) -> PING probes to send (lost: .lost)"},
    {"can_send", (PyCFunction)Recovery_can_send, METH_VARARGS, "can_send(bytes) -> bool"},
    {"pacer_next_send_time", (PyCFunction)Recovery_pacer_next_send_time, METH_VARARGS,
     "the pacer's next_send_time(now), or None"},
    {"pacer_update_after_send", (PyCFunction)Recovery_pacer_update_after_send, METH_VARARGS,
     "the pacer's update_after_send(now)"},
    {NULL, NULL, 0, NULL},
};

#define R_GETTER(name, expr)                                                       \
    static PyObject *Recovery_get_##name(RecoveryObject *self, void *closure) {    \
        if (!ready(self)) return NULL;                                             \
        return expr;                                                               \
    }

R_GETTER(bytes_in_flight, PyLong_FromUnsignedLongLong(self->r.cc.bytes_in_flight))
R_GETTER(congestion_window, PyLong_FromUnsignedLongLong(self->r.cc.congestion_window))
R_GETTER(smoothed_rtt, PyFloat_FromDouble(self->r.rtt_smoothed))
R_GETTER(rtt_min, PyFloat_FromDouble(self->r.rtt_min))
R_GETTER(rtt_latest, PyFloat_FromDouble(self->r.rtt_latest))
R_GETTER(rtt_variance, PyFloat_FromDouble(self->r.rtt_variance))
R_GETTER(pto_count, PyLong_FromLong(self->r.pto_count))
R_GETTER(loss_time, time_or_none(self->r.loss_time))
R_GETTER(largest_acked, PyLong_FromLongLong(self->r.largest_acked))
R_GETTER(ack_eliciting_in_flight, PyLong_FromUnsignedLongLong(self->r.ack_eliciting_in_flight))
R_GETTER(ring_capacity, PyLong_FromSize_t(self->r.ring_cap))
R_GETTER(held, PyLong_FromUnsignedLongLong(self->r.next_pn - self->r.first_pn))
R_GETTER(pacing_rate_bytes, PyFloat_FromDouble(self->r.pacer.pacing_rate_bytes))
R_GETTER(lost, Py_NewRef(self->lost))
R_GETTER(acked, Py_NewRef(self->acked))
R_GETTER(report, Py_BuildValue("{s:n,s:n,s:K,s:K,s:O,s:n}", "acked_packets",
                               (Py_ssize_t)self->report.acked_packets, "lost_packets",
                               (Py_ssize_t)self->report.lost_packets, "acked_bytes",
                               (unsigned long long)self->report.acked_bytes, "lost_bytes",
                               (unsigned long long)self->report.lost_bytes, "rtt_sampled",
                               self->report.rtt_sampled ? Py_True : Py_False,
                               "expired_packets", (Py_ssize_t)self->report.expired_packets))

#define R_GET(name) {#name, (getter)Recovery_get_##name, NULL, NULL, NULL}
static PyGetSetDef Recovery_getset[] = {
    R_GET(bytes_in_flight), R_GET(congestion_window), R_GET(smoothed_rtt),
    R_GET(rtt_min),         R_GET(rtt_latest),        R_GET(rtt_variance),
    R_GET(pto_count),       R_GET(loss_time),         R_GET(largest_acked),
    R_GET(ack_eliciting_in_flight), R_GET(ring_capacity), R_GET(held),
    R_GET(pacing_rate_bytes), R_GET(lost), R_GET(acked), R_GET(report),
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RecoveryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wangate.engine._engine.Recovery",
    .tp_basicsize = sizeof(RecoveryObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Recovery(max_datagram_size, initial_rtt_s, max_ack_delay_s, ring_cap=0, "
              "ring_max=...): loss detection and RTT of one channel (wg_recovery)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Recovery_init,
    .tp_dealloc = (destructor)Recovery_dealloc,
    .tp_methods = Recovery_methods,
    .tp_getset = Recovery_getset,
};

/* ------------------------------------------------------------------ Received */

typedef struct {
    PyObject_HEAD
    wg_received r;
} ReceivedObject;

static int Received_init(ReceivedObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "", kwlist)) return -1;
    wg_received_init(&self->r);
    return 0;
}

static PyObject *Received_is_new(ReceivedObject *self, PyObject *arg) {
    uint64_t pn;
    if (get_pn(arg, &pn) < 0) return NULL;
    return PyBool_FromLong(wg_received_is_new(&self->r, pn));
}

static PyObject *Received_add(ReceivedObject *self, PyObject *args) {
    PyObject *pn_obj;
    int ack_eliciting;
    double now, max_ack_delay;
    uint64_t pn;
    if (!PyArg_ParseTuple(args, "Opdd", &pn_obj, &ack_eliciting, &now, &max_ack_delay))
        return NULL;
    if (get_pn(pn_obj, &pn) < 0 || check_time(now, "now") < 0 ||
        check_time(max_ack_delay, "max_ack_delay_s") < 0)
        return NULL;
    if (max_ack_delay < 0) {
        PyErr_SetString(wg_LocalProtocolError, "max_ack_delay_s must be >= 0");
        return NULL;
    }
    return PyBool_FromLong(wg_received_add(&self->r, pn, ack_eliciting, now, max_ack_delay));
}

static PyObject *Received_ack(ReceivedObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"now", "ack_delay_exponent", NULL};
    double now;
    int exponent = 3; /* RFC 9000 §18.2's default */
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "d|i", kwlist, &now, &exponent)) return NULL;
    if (check_time(now, "now") < 0) return NULL;
    if (exponent < 0 || exponent > 20) {
        PyErr_SetString(wg_LocalProtocolError, "ack_delay_exponent must be 0 .. 20");
        return NULL;
    }
    wg_ack ack;
    if (!wg_received_ack(&self->r, &ack, now, (unsigned)exponent)) Py_RETURN_NONE;
    PyObject *ranges = PyList_New((Py_ssize_t)ack.count);
    if (ranges == NULL) return NULL;
    for (size_t i = 0; i < ack.count; i++) {
        PyObject *t = Py_BuildValue("(KK)", (unsigned long long)ack.ranges[i].smallest,
                                    (unsigned long long)ack.ranges[i].largest);
        if (t == NULL) {
            Py_DECREF(ranges);
            return NULL;
        }
        PyList_SET_ITEM(ranges, (Py_ssize_t)i, t);
    }
    return Py_BuildValue("(NK)", ranges, (unsigned long long)ack.ack_delay);
}

static PyObject *Received_ack_due(ReceivedObject *self, PyObject *args) {
    double now;
    if (!PyArg_ParseTuple(args, "d", &now)) return NULL;
    return PyBool_FromLong(wg_received_ack_due(&self->r, now));
}

static PyObject *Received_ack_sent(ReceivedObject *self, PyObject *unused) {
    wg_received_ack_sent(&self->r);
    Py_RETURN_NONE;
}

static PyObject *Received_forget(ReceivedObject *self, PyObject *arg) {
    uint64_t pn;
    if (get_pn(arg, &pn) < 0) return NULL;
    wg_received_forget(&self->r, pn);
    Py_RETURN_NONE;
}

static PyMethodDef Received_methods[] = {
    {"is_new", (PyCFunction)Received_is_new, METH_O, "is_new(pn) -> bool"},
    {"add", (PyCFunction)Received_add, METH_VARARGS,
     "add(pn, ack_eliciting, now, max_ack_delay_s) -> bool (False: not new)"},
    {"ack", (PyCFunction)(void (*)(void))Received_ack, METH_VARARGS | METH_KEYWORDS,
     "ack(now, ack_delay_exponent=3) -> ([(smallest, largest), ...] highest first, "
     "encoded delay), or None"},
    {"ack_due", (PyCFunction)Received_ack_due, METH_VARARGS, "ack_due(now) -> bool"},
    {"ack_sent", (PyCFunction)Received_ack_sent, METH_NOARGS, "an ACK went out"},
    {"forget", (PyCFunction)Received_forget, METH_O,
     "forget(pn): an ACK up to pn was acknowledged"},
    {NULL, NULL, 0, NULL},
};

static PyObject *Received_get_largest(ReceivedObject *self, void *c) {
    return PyLong_FromLongLong(self->r.largest);
}
static PyObject *Received_get_duplicates(ReceivedObject *self, void *c) {
    return PyLong_FromUnsignedLongLong(self->r.duplicates);
}
static PyObject *Received_get_too_old(ReceivedObject *self, void *c) {
    return PyLong_FromUnsignedLongLong(self->r.too_old);
}
static PyObject *Received_get_ack_at(ReceivedObject *self, void *c) {
    return time_or_none(self->r.ack_at);
}

static PyGetSetDef Received_getset[] = {
    {"largest", (getter)Received_get_largest, NULL, NULL, NULL},
    {"duplicates", (getter)Received_get_duplicates, NULL, NULL, NULL},
    {"too_old", (getter)Received_get_too_old, NULL, NULL, NULL},
    {"ack_at", (getter)Received_get_ack_at, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *Received_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    ReceivedObject *self = (ReceivedObject *)type->tp_alloc(type, 0);
    if (self != NULL) wg_received_init(&self->r); /* usable even before __init__ */
    return (PyObject *)self;
}

static PyTypeObject ReceivedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wangate.engine._engine.Received",
    .tp_basicsize = sizeof(ReceivedObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Received(): what one channel has received (wg_received)",
    .tp_new = Received_new,
    .tp_init = (initproc)Received_init,
    .tp_methods = Received_methods,
    .tp_getset = Received_getset,
};

int wg_py_add_recovery_types(PyObject *module) {
    if (wg_py_add_type(module, &RecoveryType, "Recovery") < 0) return -1;
    if (wg_py_add_type(module, &ReceivedType, "Received") < 0) return -1;
    if (PyModule_AddIntConstant(module, "WG_MAX_ACK_RANGES", WG_MAX_ACK_RANGES) < 0 ||
        PyModule_AddIntConstant(module, "WG_REPLAY_WINDOW", WG_REPLAY_WINDOW) < 0 ||
        PyModule_AddIntConstant(module, "WG_PTO_PROBES", WG_PTO_PROBES) < 0 ||
        PyModule_AddIntConstant(module, "WG_RECOVERY_RING_MAX", (long)WG_RECOVERY_RING_MAX) < 0)
        return -1;
    return 0;
}
