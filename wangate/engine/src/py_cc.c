/* Test-only Python types over wg_cc and wg_pacer, shaped like the Python classes they
 * port so tests/test_engine_cc.py can drive both side by side: CongestionModel keeps
 * the caller's part (each packet's wg_cc_packet, by packet number) in a dict, Pacer
 * wraps wg_pacer.  Misuse (an unknown or repeated packet number) raises
 * LocalProtocolError rather than corrupting the counters. */
#include "wg_py.h"

#include <stddef.h>
#include <string.h>

#include "wg_cc.h"

PyMethodDef wg_py_cc_methods[] = {{NULL, NULL, 0, NULL}};

/* what the channel keeps beside a sent packet, stored as bytes in the dict */
typedef struct {
    wg_cc_packet cc;
    size_t sent_bytes;
} sent_entry;

typedef struct {
    PyObject_HEAD
    wg_cc cc;
    PyObject *sent; /* dict: packet number -> bytes(sent_entry) */
} CongestionModel;

typedef struct {
    PyObject_HEAD
    wg_pacer pacer;
} Pacer;

static PyTypeObject CongestionModelType;

static int parse_size(PyObject *args, PyObject *kwds, size_t *size) {
    static char *kwlist[] = {"max_datagram_size", NULL};
    Py_ssize_t n;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &n)) return -1;
    if (n <= 0) {
        PyErr_SetString(wg_LocalProtocolError, "max_datagram_size must be positive");
        return -1;
    }
    *size = (size_t)n;
    return 0;
}

/* ---------------------------------------------------------- CongestionModel */

static int model_init(CongestionModel *self, PyObject *args, PyObject *kwds) {
    size_t size;
    if (parse_size(args, kwds, &size) < 0) return -1;
    wg_cc_init(&self->cc, size);
    Py_XSETREF(self->sent, PyDict_New());
    return self->sent == NULL ? -1 : 0;
}

static void model_dealloc(CongestionModel *self) {
    Py_XDECREF(self->sent);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* the entry of packet number `pn` (a new reference to its key), or -1 with
 * LocalProtocolError where the model never sent it or already let it go */
static int lookup(CongestionModel *self, PyObject *pn, sent_entry *entry) {
    if (!PyLong_Check(pn)) {
        PyErr_SetString(wg_LocalProtocolError, "a packet number is an int");
        return -1;
    }
    PyObject *value = PyDict_GetItemWithError(self->sent, pn);
    if (value == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(wg_LocalProtocolError, "packet %R is not in flight", pn);
        return -1;
    }
    memcpy(entry, PyBytes_AS_STRING(value), sizeof *entry);
    return 0;
}

static PyObject *model_on_packet_sent(CongestionModel *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"pn", "sent_bytes", "now", NULL};
    PyObject *pn;
    Py_ssize_t sent_bytes;
    double now;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!nd", kwlist, &PyLong_Type, &pn,
                                     &sent_bytes, &now))
        return NULL;
    if (sent_bytes <= 0) {
        PyErr_SetString(wg_LocalProtocolError, "sent_bytes must be positive");
        return NULL;
    }
    int present = PyDict_Contains(self->sent, pn);
    if (present < 0) return NULL;
    if (present) {
        PyErr_Format(wg_LocalProtocolError, "packet %R is already in flight", pn);
        return NULL;
    }
    sent_entry entry = {.sent_bytes = (size_t)sent_bytes};
    wg_cc_on_sent(&self->cc, &entry.cc, entry.sent_bytes, now);
    PyObject *value = PyBytes_FromStringAndSize((const char *)&entry, sizeof entry);
    if (value == NULL || PyDict_SetItem(self->sent, pn, value) < 0) {
        Py_XDECREF(value);
        self->cc.bytes_in_flight -= entry.sent_bytes;
        return NULL;
    }
    Py_DECREF(value);
    Py_RETURN_NONE;
}

static PyObject *model_on_packet_acked(CongestionModel *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"pn", "now", NULL};
    PyObject *pn;
    double now;
    sent_entry entry;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Od", kwlist, &pn, &now)) return NULL;
    if (lookup(self, pn, &entry) < 0 || PyDict_DelItem(self->sent, pn) < 0) return NULL;
    wg_cc_on_acked(&self->cc, &entry.cc, entry.sent_bytes, now);
    Py_RETURN_NONE;
}

/* the entries of a batch, all in flight and none twice, taken out of the dict;
 * NULL with an exception (and the dict untouched) otherwise */
static sent_entry *take_batch(CongestionModel *self, PyObject *pns, Py_ssize_t *count) {
    PyObject *seq = PySequence_Fast(pns, "packet numbers must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    sent_entry *entries = PyMem_Malloc(sizeof(sent_entry) * (size_t)(n ? n : 1));
    PyObject *seen = PySet_New(NULL);
    if (entries == NULL || seen == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pn = PySequence_Fast_GET_ITEM(seq, i);
        if (lookup(self, pn, &entries[i]) < 0) goto fail;
        int dup = PySet_Contains(seen, pn);
        if (dup < 0) goto fail;
        if (dup) {
            PyErr_Format(wg_LocalProtocolError, "packet %R is twice in the batch", pn);
            goto fail;
        }
        if (PySet_Add(seen, pn) < 0) goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyDict_DelItem(self->sent, PySequence_Fast_GET_ITEM(seq, i)) < 0) goto fail;
    Py_DECREF(seen);
    Py_DECREF(seq);
    *count = n;
    return entries;
fail:
    PyMem_Free(entries);
    Py_XDECREF(seen);
    Py_DECREF(seq);
    return NULL;
}

static PyObject *model_on_packets_lost(CongestionModel *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"pns", "now", NULL};
    PyObject *pns;
    double now;
    Py_ssize_t n;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Od", kwlist, &pns, &now)) return NULL;
    sent_entry *entries = take_batch(self, pns, &n);
    if (entries == NULL) return NULL;
    /* the batch call as the recovery makes it: one packet at a time, then the end */
    for (Py_ssize_t i = 0; i < n; i++)
        wg_cc_on_lost_packet(&self->cc, &entries[i].cc, entries[i].sent_bytes);
    wg_cc_on_lost_end(&self->cc, now);
    PyMem_Free(entries);
    Py_RETURN_NONE;
}

static PyObject *model_on_packets_expired(CongestionModel *self, PyObject *args,
                                          PyObject *kwds) {
    static char *kwlist[] = {"pns", NULL};
    PyObject *pns;
    Py_ssize_t n;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &pns)) return NULL;
    sent_entry *entries = take_batch(self, pns, &n);
    if (entries == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        wg_cc_on_expired_packet(&self->cc, &entries[i].cc, entries[i].sent_bytes);
    PyMem_Free(entries);
    Py_RETURN_NONE;
}

/* the whole-array form of the batch calls, for a test that they agree */
static PyObject *model_on_packets_lost_array(CongestionModel *self, PyObject *args) {
    PyObject *pns;
    double now;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "Od", &pns, &now)) return NULL;
    sent_entry *entries = take_batch(self, pns, &n);
    if (entries == NULL) return NULL;
    wg_cc_packet *packets = PyMem_Malloc(sizeof(wg_cc_packet) * (size_t)(n ? n : 1));
    size_t *sizes = PyMem_Malloc(sizeof(size_t) * (size_t)(n ? n : 1));
    if (packets == NULL || sizes == NULL) {
        /* the batch is out of the dict already: count it anyway, one at a time */
        for (Py_ssize_t i = 0; i < n; i++)
            wg_cc_on_lost_packet(&self->cc, &entries[i].cc, entries[i].sent_bytes);
        wg_cc_on_lost_end(&self->cc, now);
        PyMem_Free(packets);
        PyMem_Free(sizes);
        PyMem_Free(entries);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        packets[i] = entries[i].cc;
        sizes[i] = entries[i].sent_bytes;
    }
    wg_cc_on_lost(&self->cc, packets, sizes, (size_t)n, now);
    PyMem_Free(packets);
    PyMem_Free(sizes);
    PyMem_Free(entries);
    Py_RETURN_NONE;
}

static PyObject *model_forget(CongestionModel *self, PyObject *pn) {
    /* the controller no longer knows the packet (Python: gone from _sent); the caller
     * still counts its bytes in flight */
    sent_entry entry;
    if (lookup(self, pn, &entry) < 0) return NULL;
    entry.cc.tracked = 0;
    PyObject *value = PyBytes_FromStringAndSize((const char *)&entry, sizeof entry);
    if (value == NULL) return NULL;
    int rc = PyDict_SetItem(self->sent, pn, value);
    Py_DECREF(value);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *model_on_rtt_measurement(CongestionModel *self, PyObject *args,
                                          PyObject *kwds) {
    static char *kwlist[] = {"rtt", "now", NULL};
    double rtt, now;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "dd", kwlist, &rtt, &now)) return NULL;
    wg_cc_on_rtt(&self->cc, rtt, now);
    Py_RETURN_NONE;
}

static PyObject *model_on_persistent_congestion(CongestionModel *self, PyObject *unused) {
    wg_cc_on_persistent_congestion(&self->cc);
    Py_RETURN_NONE;
}

static PyObject *model_pacing_rate_bytes(CongestionModel *self, PyObject *arg) {
    double srtt = PyFloat_AsDouble(arg);
    if (srtt == -1.0 && PyErr_Occurred()) return NULL;
    double rate = wg_cc_pacing_rate(&self->cc, srtt);
    if (rate < 0.0) Py_RETURN_NONE;
    return PyFloat_FromDouble(rate);
}

static PyObject *get_u64(uint64_t v) { return PyLong_FromUnsignedLongLong(v); }
static PyObject *get_optional(double v) {
    if (v < 0.0) Py_RETURN_NONE;
    return PyFloat_FromDouble(v);
}

#define MODEL(o) (&((CongestionModel *)(o))->cc)
static PyObject *m_cwnd(PyObject *o, void *c) { return get_u64(MODEL(o)->congestion_window); }
static PyObject *m_bif(PyObject *o, void *c) { return get_u64(MODEL(o)->bytes_in_flight); }
static PyObject *m_state(PyObject *o, void *c) {
    return PyUnicode_FromString(wg_cc_state_name(MODEL(o)->state));
}
static PyObject *m_btl(PyObject *o, void *c) { return PyFloat_FromDouble(MODEL(o)->btl_bw_bps); }
static PyObject *m_min_rtt(PyObject *o, void *c) { return get_optional(MODEL(o)->min_rtt_s); }
static PyObject *m_srtt(PyObject *o, void *c) { return get_optional(MODEL(o)->srtt_s); }
static PyObject *m_round(PyObject *o, void *c) { return PyLong_FromLongLong(MODEL(o)->round_count); }
static PyObject *m_random(PyObject *o, void *c) { return PyFloat_FromDouble(MODEL(o)->random_loss); }
static PyObject *m_baseline(PyObject *o, void *c) {
    return PyFloat_FromDouble(MODEL(o)->loss_baseline);
}
static PyObject *m_events(PyObject *o, void *c) { return get_u64(MODEL(o)->congestion_events); }
static PyObject *m_filled(PyObject *o, void *c) { return PyBool_FromLong(MODEL(o)->filled_pipe); }
static PyObject *m_delivered(PyObject *o, void *c) { return get_u64(MODEL(o)->delivered_bytes); }
static PyObject *m_sending(PyObject *o, void *c) {
    return PyFloat_FromDouble(wg_cc_sending_rate_bps(MODEL(o)));
}
static PyObject *m_gain(PyObject *o, void *c) { return PyFloat_FromDouble(wg_cc_pacing_gain(MODEL(o))); }
static PyObject *m_samples(PyObject *o, void *c) { return PyLong_FromSize_t(MODEL(o)->bw_count); }
static PyObject *m_min_window(PyObject *o, void *c) { return get_u64(MODEL(o)->min_window); }
static PyObject *m_min_target(PyObject *o, void *c) { return get_u64(MODEL(o)->min_target_window); }
static PyObject *m_initial(PyObject *o, void *c) { return get_u64(MODEL(o)->initial_window); }

static PyGetSetDef model_getset[] = {
    {"congestion_window", m_cwnd, NULL, NULL, NULL},
    {"bytes_in_flight", m_bif, NULL, NULL, NULL},
    {"state", m_state, NULL, NULL, NULL},
    {"btl_bw_bps", m_btl, NULL, NULL, NULL},
    {"min_rtt_s", m_min_rtt, NULL, NULL, NULL},
    {"srtt_s", m_srtt, NULL, NULL, NULL},
    {"round_count", m_round, NULL, NULL, NULL},
    {"random_loss", m_random, NULL, NULL, NULL},
    {"loss_baseline", m_baseline, NULL, NULL, NULL},
    {"congestion_events", m_events, NULL, NULL, NULL},
    {"filled_pipe", m_filled, NULL, NULL, NULL},
    {"delivered_bytes", m_delivered, NULL, NULL, NULL},
    {"sending_rate_bps", m_sending, NULL, NULL, NULL},
    {"pacing_gain", m_gain, NULL, NULL, NULL},
    {"bw_samples", m_samples, NULL, "samples held by the bounded max-filter", NULL},
    {"min_window", m_min_window, NULL, NULL, NULL},
    {"min_target_window", m_min_target, NULL, NULL, NULL},
    {"initial_window", m_initial, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef model_methods[] = {
    {"on_packet_sent", (PyCFunction)(void (*)(void))model_on_packet_sent,
     METH_VARARGS | METH_KEYWORDS, "on_packet_sent(pn, sent_bytes, now)"},
    {"on_packet_acked", (PyCFunction)(void (*)(void))model_on_packet_acked,
     METH_VARARGS | METH_KEYWORDS, "on_packet_acked(pn, now)"},
    {"on_packets_lost", (PyCFunction)(void (*)(void))model_on_packets_lost,
     METH_VARARGS | METH_KEYWORDS, "on_packets_lost(pns, now)"},
    {"on_packets_lost_array", (PyCFunction)model_on_packets_lost_array, METH_VARARGS,
     "on_packets_lost(pns, now) through wg_cc_on_lost's arrays"},
    {"on_packets_expired", (PyCFunction)(void (*)(void))model_on_packets_expired,
     METH_VARARGS | METH_KEYWORDS, "on_packets_expired(pns)"},
    {"on_rtt_measurement", (PyCFunction)(void (*)(void))model_on_rtt_measurement,
     METH_VARARGS | METH_KEYWORDS, "on_rtt_measurement(rtt, now)"},
    {"on_persistent_congestion", (PyCFunction)model_on_persistent_congestion, METH_NOARGS,
     NULL},
    {"pacing_rate_bytes", (PyCFunction)model_pacing_rate_bytes, METH_O,
     "pacing_rate_bytes(srtt) -> float | None"},
    {"forget", (PyCFunction)model_forget, METH_O,
     "forget(pn): the controller loses track of a packet still in flight"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CongestionModelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "wangate.engine._engine.CongestionModel",
    .tp_doc = "wg_cc driven by packet number (tests: WangateCongestionControl's twin)",
    .tp_basicsize = sizeof(CongestionModel),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)model_init,
    .tp_dealloc = (destructor)model_dealloc,
    .tp_methods = model_methods,
    .tp_getset = model_getset,
};

/* -------------------------------------------------------------------- Pacer */

static int pacer_init(Pacer *self, PyObject *args, PyObject *kwds) {
    size_t size;
    if (parse_size(args, kwds, &size) < 0) return -1;
    wg_pacer_init(&self->pacer, size);
    return 0;
}

static PyObject *pacer_next_send_time(Pacer *self, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    double at = wg_pacer_next_send_time(&self->pacer, now);
    if (at < 0.0) Py_RETURN_NONE;
    return PyFloat_FromDouble(at);
}

static PyObject *pacer_update_after_send(Pacer *self, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    wg_pacer_update_after_send(&self->pacer, now);
    Py_RETURN_NONE;
}

static PyObject *pacer_update_rate(Pacer *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"model", "congestion_window", "smoothed_rtt", NULL};
    PyObject *model;
    unsigned long long cwnd;
    double srtt;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OKd", kwlist, &model, &cwnd, &srtt))
        return NULL;
    if (model != Py_None && !PyObject_TypeCheck(model, &CongestionModelType)) {
        PyErr_SetString(wg_LocalProtocolError, "model must be a CongestionModel or None");
        return NULL;
    }
    const wg_cc *cc = model == Py_None ? NULL : MODEL(model);
    wg_pacer_update_rate(&self->pacer, cc, cwnd, srtt);
    Py_RETURN_NONE;
}

#define PACER(o) (&((Pacer *)(o))->pacer)
static PyObject *p_burst(PyObject *o, void *c) { return PyBool_FromLong(PACER(o)->burst); }
static int p_set_burst(PyObject *o, PyObject *v, void *c) {
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "burst cannot be deleted");
        return -1;
    }
    int on = PyObject_IsTrue(v);
    if (on < 0) return -1;
    PACER(o)->burst = on;
    return 0;
}
static PyObject *p_bucket_max(PyObject *o, void *c) { return PyFloat_FromDouble(PACER(o)->bucket_max); }
static PyObject *p_bucket_time(PyObject *o, void *c) {
    return PyFloat_FromDouble(PACER(o)->bucket_time);
}
static PyObject *p_evaluation(PyObject *o, void *c) {
    return PyFloat_FromDouble(PACER(o)->evaluation_time);
}
static PyObject *p_packet_time(PyObject *o, void *c) { return get_optional(PACER(o)->packet_time); }
static PyObject *p_rate(PyObject *o, void *c) {
    return PyFloat_FromDouble(PACER(o)->pacing_rate_bytes);
}

static PyGetSetDef pacer_getset[] = {
    {"burst", p_burst, p_set_burst, NULL, NULL},
    {"bucket_max", p_bucket_max, NULL, NULL, NULL},
    {"bucket_time", p_bucket_time, NULL, NULL, NULL},
    {"evaluation_time", p_evaluation, NULL, NULL, NULL},
    {"packet_time", p_packet_time, NULL, NULL, NULL},
    {"pacing_rate_bytes", p_rate, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef pacer_methods[] = {
    {"next_send_time", (PyCFunction)pacer_next_send_time, METH_O,
     "next_send_time(now) -> float | None"},
    {"update_after_send", (PyCFunction)pacer_update_after_send, METH_O, NULL},
    {"update_rate", (PyCFunction)(void (*)(void))pacer_update_rate,
     METH_VARARGS | METH_KEYWORDS, "update_rate(model, congestion_window, smoothed_rtt)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PacerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "wangate.engine._engine.Pacer",
    .tp_doc = "wg_pacer (tests: BurstablePacer's twin)",
    .tp_basicsize = sizeof(Pacer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pacer_init,
    .tp_methods = pacer_methods,
    .tp_getset = pacer_getset,
};

int wg_py_add_cc_types(PyObject *module) {
    if (wg_py_add_type(module, &CongestionModelType, "CongestionModel") < 0) return -1;
    return wg_py_add_type(module, &PacerType, "Pacer");
}
