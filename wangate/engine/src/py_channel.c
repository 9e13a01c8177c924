/* wangate.engine._engine.PathChannel: a path's data plane (wg_channel.h) for Python.
 *
 * Python hands it datagrams and received UDP payloads, and asks it to flush and when
 * to wake it; everything per packet happens in C. */
#include <arpa/inet.h>
#include <string.h>

#include "py_read.h"
#include "wg_channel.h"
#include "wg_py.h"
#include "wg_reader.h"

typedef struct {
    PyObject_HEAD
    wg_channel ch;
    int ready;
    int gro; /* read() asks the kernel to coalesce (UDP GRO) */
    ReadBatch *batch; /* allocated by the first read() */
} ChannelObject;

static int parse_address(PyObject *address, struct sockaddr_storage *out, socklen_t *len) {
    const char *host;
    int port;
    unsigned flowinfo = 0, scope_id = 0;
    if (!PyArg_ParseTuple(address, "si|II", &host, &port, &flowinfo, &scope_id)) return -1;
    if (port < 0 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "port %d out of range", port);
        return -1;
    }
    memset(out, 0, sizeof(*out));
    struct sockaddr_in *v4 = (struct sockaddr_in *)out;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)out;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        *len = sizeof(*v4);
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        v6->sin6_flowinfo = htonl(flowinfo);
        v6->sin6_scope_id = scope_id;
        *len = sizeof(*v6);
    } else {
        PyErr_Format(PyExc_ValueError, "not a numeric IP address: %s", host);
        return -1;
    }
    return 0;
}

static int Channel_init(ChannelObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"fd", "peer", "suite", "send_secret", "recv_secret",
                             "max_packet_bytes", "initial_rtt_s", "key_update_packets", NULL};
    int fd, suite;
    PyObject *peer;
    Py_buffer send, recv;
    Py_ssize_t max_packet;
    double initial_rtt_s;
    unsigned long long key_update = WG_DEFAULT_KEY_UPDATE_PACKETS;
    if (self->ready) {
        PyErr_SetString(wg_LocalProtocolError, "a channel is set up once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOiy*y*nd|K", kwlist, &fd, &peer, &suite, &send,
                                     &recv, &max_packet, &initial_rtt_s, &key_update))
        return -1;
    struct sockaddr_storage address;
    socklen_t address_len;
    int rc = -1;
    const char *why = NULL;
    if (parse_address(peer, &address, &address_len) < 0) goto done;
    if (max_packet < 0 || !(initial_rtt_s > 0.0 && initial_rtt_s < 60.0)) {
        PyErr_SetString(wg_LocalProtocolError, "max_packet_bytes and initial_rtt_s must be positive");
        goto done;
    }
    if (wg_channel_init(&self->ch, fd, (struct sockaddr *)&address, address_len, suite, send.buf,
                        (size_t)send.len, recv.buf, (size_t)recv.len, (size_t)max_packet,
                        initial_rtt_s, key_update, &why) < 0) {
        PyErr_Format(wg_LocalProtocolError, "data-plane channel: %s", why);
        goto done;
    }
    self->ready = 1;
    self->gro = 1;
    rc = 0;
done:
    PyBuffer_Release(&send);
    PyBuffer_Release(&recv);
    return rc;
}

static void Channel_dealloc(ChannelObject *self) {
    if (self->ready) wg_channel_free(&self->ch);
    wg_py_batch_free(self->batch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define READY(self)                                                               \
    if (!(self)->ready) {                                                         \
        PyErr_SetString(wg_LocalProtocolError, "the channel is not set up");      \
        return NULL;                                                              \
    }

static PyObject *Channel_queue(ChannelObject *self, PyObject *arg) {
    READY(self);
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0) return NULL;
    int rc = wg_channel_queue(&self->ch, data.buf, (size_t)data.len);
    Py_ssize_t len = data.len;
    PyBuffer_Release(&data);
    if (rc < 0) {
        PyErr_Format(wg_LocalProtocolError, "a datagram of %zd bytes does not fit (at most %zu)",
                     len, self->ch.max_datagram_bytes);
        return NULL;
    }
    return PyBool_FromLong(rc);
}

/* queue() for each datagram of a list, in order: how many went in (fewer when the queue
 * filled up; the rest are the caller's). */
/* a span's datagrams framed into the queue (the copies with the GIL released): how
 * many went in, or -1 with an exception set */
static Py_ssize_t queue_span(ChannelObject *self, PyObject *item) {
    wg_span span;
    Py_buffer view;
    size_t count, longest, queued;
    if (wg_py_span_parse(item, &span, &view, &count, &longest) < 0) return -1;
    if (longest > self->ch.max_datagram_bytes) {
        PyBuffer_Release(&view);
        PyErr_Format(wg_LocalProtocolError,
                     "a span's datagrams of %zu bytes do not fit (at most %zu)", longest,
                     self->ch.max_datagram_bytes);
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    queued = wg_channel_queue_span(&self->ch, &span, count);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return (Py_ssize_t)queued;
}

/* queue() for each datagram of a list, in order, a ShardSpan for each of its datagrams:
 * how many datagrams went in (fewer when the queue filled up; the rest are the
 * caller's). */
static PyObject *Channel_queue_many(ChannelObject *self, PyObject *arg) {
    READY(self);
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "queue_many() takes a list of datagrams");
        return NULL;
    }
    Py_ssize_t queued = 0, count = PyList_GET_SIZE(arg);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(arg, i);
        if (PyTuple_Check(item)) {
            Py_ssize_t n = queue_span(self, item);
            if (n < 0) return NULL;
            queued += n;
            if (self->ch.queue_count == WG_QUEUE_SLOTS) break;
            continue;
        }
        Py_buffer data;
        if (PyObject_GetBuffer(item, &data, PyBUF_SIMPLE) < 0) return NULL;
        int rc = wg_channel_queue(&self->ch, data.buf, (size_t)data.len);
        Py_ssize_t len = data.len;
        PyBuffer_Release(&data);
        if (rc < 0) {
            PyErr_Format(wg_LocalProtocolError,
                         "a datagram of %zd bytes does not fit (at most %zu)", len,
                         self->ch.max_datagram_bytes);
            return NULL;
        }
        if (rc == 0) break;
        queued++;
    }
    return PyLong_FromSsize_t(queued);
}

static PyObject *Channel_fit(ChannelObject *self, PyObject *arg) {
    READY(self);
    Py_ssize_t size = PyLong_AsSsize_t(arg);
    if (size == -1 && PyErr_Occurred()) return NULL;
    if (size < 0 || wg_channel_fit(&self->ch, (size_t)size) < 0) {
        PyErr_Format(wg_LocalProtocolError, "max_packet_bytes %zd: at least 1200, at most %zu",
                     size, self->ch.batch_stride);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Channel_flush(ChannelObject *self, PyObject *arg) {
    READY(self);
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    size_t sent;
    Py_BEGIN_ALLOW_THREADS sent = wg_channel_flush(&self->ch, now);
    Py_END_ALLOW_THREADS return PyLong_FromSize_t(sent);
}

/* False: not this channel's packet; None: handled, nothing for the session; bytes:
 * one datagram; a list: several */
static PyObject *Channel_receive(ChannelObject *self, PyObject *const *args, Py_ssize_t nargs) {
    READY(self);
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "receive(data, now)");
        return NULL;
    }
    Py_buffer data;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0) return NULL;
    double now = PyFloat_AsDouble(args[1]);
    if (now == -1.0 && PyErr_Occurred()) {
        PyBuffer_Release(&data);
        return NULL;
    }
    wg_parsed parsed;
    int n = wg_channel_receive(&self->ch, data.buf, (size_t)data.len, now, &parsed);
    PyBuffer_Release(&data);
    const uint8_t *frames = self->ch.scratch + WG_SHORT_HEADER_LEN;
    switch (n) {
    case WG_RECEIVE_NOT_MINE:
        Py_RETURN_FALSE;
    case WG_RECEIVE_DROPPED:
    case 0:
        Py_RETURN_NONE;
    case WG_RECEIVE_MALFORMED:
        PyErr_SetString(wg_RemoteProtocolError, wg_MALFORMED_FRAMES);
        return NULL;
    case WG_RECEIVE_BAD_ACK:
        PyErr_SetString(wg_RemoteProtocolError, wg_ACK_NEVER_SENT);
        return NULL;
    case 1:
        return PyBytes_FromStringAndSize((const char *)frames + parsed.datagram_off[0],
                                         (Py_ssize_t)parsed.datagram_len[0]);
    default:
        break;
    }
    PyObject *list = PyList_New(n);
    if (list == NULL) return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)frames + parsed.datagram_off[i],
                                                (Py_ssize_t)parsed.datagram_len[i]);
        if (b == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, b);
    }
    return list;
}

/* every packet of its own socket is the channel's to open (or to hand back: not ours) */
static wg_channel *own_channel(void *ctx, const uint8_t *packet, size_t len, uint32_t *route) {
    (void)packet, (void)len;
    *route = 0;
    return &((ChannelObject *)ctx)->ch;
}

/* read(now) -> (datagrams, foreign, errors, buffers, packets): what the channel's own
 * socket holds, up to WG_READ_BATCH buffers in one recvmmsg, each packet opened where it
 * lies; packets counts every one, dropped ones too (what the read cost). The socket,
 * its packets and their opening all run without the GIL. */
static PyObject *Channel_read(ChannelObject *self, PyObject *arg) {
    READY(self);
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    if (self->batch == NULL && (self->batch = wg_py_batch_new(self->ch.fd, self->gro)) == NULL)
        return NULL;
    ReadBatch *b = self->batch;
    int n = wg_py_batch_read(b, self->ch.fd, now, own_channel, self);
    self->ch.stats.coalesced_reads += b->coalesced_reads;
    self->ch.stats.read_overflow += b->read_overflow;
    if (n < 0) return NULL;
    Py_ssize_t count = 0;
    for (size_t k = 0; k < b->packets; k++) count += b->packet[k].datagrams;
    PyObject *datagrams = wg_py_datagrams_new((PyObject *)self, self->batch, count);
    PyObject *foreign = PyList_New(0), *errors = PyList_New(0);
    if (datagrams == NULL || foreign == NULL || errors == NULL) goto fail;
    for (size_t k = 0; k < b->packets; k++)
        if (wg_py_append_packet(b, &b->packet[k], datagrams, foreign, errors) < 0) goto fail;
    return Py_BuildValue("(NNNin)", datagrams, foreign, errors, n, (Py_ssize_t)b->packets);
fail:
    Py_XDECREF(datagrams);
    Py_XDECREF(foreign);
    Py_XDECREF(errors);
    return NULL;
}

static PyObject *Channel_timer(ChannelObject *self, PyObject *arg) {
    READY(self);
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    double at = wg_channel_timer(&self->ch, now);
    if (at < 0) Py_RETURN_NONE;
    return PyFloat_FromDouble(at);
}

static PyObject *Channel_on_timer(ChannelObject *self, PyObject *arg) {
    READY(self);
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    wg_channel_on_timer(&self->ch, now);
    Py_RETURN_NONE;
}

#define STAT(name) \
    if (PyDict_SetItemString(d, #name, v = PyLong_FromUnsignedLongLong(s->name)) < 0) goto fail; \
    Py_DECREF(v);

static PyObject *Channel_stats(ChannelObject *self, PyObject *unused) {
    READY(self);
    const wg_channel_stats *s = &self->ch.stats;
    const wg_recovery *r = &self->ch.recovery;
    PyObject *d = PyDict_New(), *v = NULL;
    if (d == NULL) return NULL;
    STAT(packets_sent) STAT(packets_received) STAT(bytes_sent) STAT(bytes_received)
    STAT(datagrams_sent) STAT(datagrams_received) STAT(acked_packets) STAT(lost_packets)
    STAT(lost_bytes) STAT(not_opened) STAT(replayed) STAT(send_dropped) STAT(send_errors)
    STAT(key_updates) STAT(probes_sent) STAT(segmented_sends)
    STAT(coalesced_reads) STAT(read_overflow)
#define FIELD(key, value)                                                     \
    if (PyDict_SetItemString(d, key, v = (value)) < 0) goto fail;             \
    Py_DECREF(v);
    FIELD("congestion_window", PyLong_FromUnsignedLongLong(r->cc.congestion_window))
    FIELD("bytes_in_flight", PyLong_FromUnsignedLongLong(r->cc.bytes_in_flight))
    FIELD("smoothed_rtt_s", PyFloat_FromDouble(r->rtt_smoothed))
    FIELD("min_rtt_s", PyFloat_FromDouble(r->rtt_min))
    FIELD("pacing_rate_bytes", PyFloat_FromDouble(r->pacer.pacing_rate_bytes))
    FIELD("key_phase", PyLong_FromLong(self->ch.send_phase))
    FIELD("queued", PyLong_FromSize_t(self->ch.queue_count))
    return d;
fail:
    Py_XDECREF(v);
    Py_DECREF(d);
    return NULL;
}

static Py_ssize_t Channel_len(ChannelObject *self) {
    return self->ready ? (Py_ssize_t)self->ch.queue_count : 0;
}

/* a boolean attribute's new value: 0 or 1, or -1 with an exception set */
static int flag_value(ChannelObject *self, PyObject *value) {
    if (!self->ready || value == NULL) {
        PyErr_SetString(wg_LocalProtocolError, "the channel is not set up");
        return -1;
    }
    return PyObject_IsTrue(value);
}

static PyObject *Channel_get_burst(ChannelObject *self, void *unused) {
    return PyBool_FromLong(self->ready && self->ch.recovery.pacer.burst);
}

static int Channel_set_burst(ChannelObject *self, PyObject *value, void *unused) {
    int on = flag_value(self, value);
    if (on < 0) return -1;
    self->ch.recovery.pacer.burst = on;
    return 0;
}

static PyObject *Channel_get_gso(ChannelObject *self, void *unused) {
    return PyBool_FromLong(self->ready && self->ch.gso);
}

static int Channel_set_gso(ChannelObject *self, PyObject *value, void *unused) {
    int on = flag_value(self, value);
    if (on < 0) return -1;
    self->ch.gso = on;
    return 0;
}

static PyObject *Channel_get_gro(ChannelObject *self, void *unused) {
    return PyBool_FromLong(self->ready && self->gro &&
                           (self->batch == NULL || self->batch->reader.gro));
}

static int Channel_set_gro(ChannelObject *self, PyObject *value, void *unused) {
    int on = flag_value(self, value);
    if (on < 0) return -1;
    self->gro = on;
    if (self->batch != NULL) (void)wg_reader_set_gro(&self->batch->reader, self->ch.fd, on);
    return 0;
}

static PyObject *Channel_get_recv_cid(ChannelObject *self, void *unused) {
    READY(self);
    return PyBytes_FromStringAndSize((const char *)self->ch.recv_cid, WG_CID_LEN);
}

static PyObject *Channel_get_send_cid(ChannelObject *self, void *unused) {
    READY(self);
    return PyBytes_FromStringAndSize((const char *)self->ch.send_cid, WG_CID_LEN);
}

static PyObject *Channel_get_datagram_bytes(ChannelObject *self, void *unused) {
    READY(self);
    return PyLong_FromSize_t(self->ch.max_datagram_bytes);
}

static PyObject *Channel_get_pacing_rate(ChannelObject *self, void *unused) {
    READY(self);
    return PyFloat_FromDouble(self->ch.recovery.pacer.pacing_rate_bytes);
}

static PyMethodDef Channel_methods[] = {
    {"queue", (PyCFunction)Channel_queue, METH_O,
     "queue(datagram) -> bool: copied into the send queue; False when it is full"},
    {"queue_many", (PyCFunction)Channel_queue_many, METH_O,
     "queue_many(datagrams) -> how many datagrams were queued, in order (fewer when full); "
     "an item may be a ShardSpan, framed here"},
    {"fit", (PyCFunction)Channel_fit, METH_O,
     "fit(max_packet_bytes): smaller packets from now on (datagram_bytes follows)"},
    {"flush", (PyCFunction)Channel_flush, METH_O,
     "flush(now) -> packets sent, within the window and the pacer"},
    {"receive", (PyCFunction)(void (*)(void))Channel_receive, METH_FASTCALL,
     "receive(data, now) -> False (not ours) | None | bytes | list[bytes]"},
    {"read", (PyCFunction)Channel_read, METH_O,
     "read(now) -> (datagrams, foreign, errors, count): a batch from the channel's socket"},
    {"timer", (PyCFunction)Channel_timer, METH_O, "timer(now) -> when to call on_timer, or None"},
    {"on_timer", (PyCFunction)Channel_on_timer, METH_O, "on_timer(now): loss detection, probes"},
    {"stats", (PyCFunction)Channel_stats, METH_NOARGS, "stats() -> dict of counters"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Channel_getset[] = {
    {"burst", (getter)Channel_get_burst, (setter)Channel_set_burst,
     "unpaced while critical data waits", NULL},
    {"gso", (getter)Channel_get_gso, (setter)Channel_set_gso,
     "equal packets go to the kernel as one buffer it cuts (UDP GSO); off once it refuses",
     NULL},
    {"gro", (getter)Channel_get_gro, (setter)Channel_set_gro,
     "read() takes the kernel's coalesced buffers and cuts them (UDP GRO; from its first call)",
     NULL},
    {"recv_cid", (getter)Channel_get_recv_cid, NULL, "the connection ID packets to us carry", NULL},
    {"send_cid", (getter)Channel_get_send_cid, NULL, "the connection ID of packets we send", NULL},
    {"datagram_bytes", (getter)Channel_get_datagram_bytes, NULL, "the largest datagram", NULL},
    {"pacing_rate_bytes", (getter)Channel_get_pacing_rate, NULL,
     "the pacer's rate, bytes per second (0 before the controller has one)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Channel_as_sequence = {.sq_length = (lenfunc)Channel_len};

PyTypeObject wg_ChannelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wangate.engine._engine.PathChannel",
    .tp_basicsize = sizeof(ChannelObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PathChannel(fd, peer, suite, send_secret, recv_secret, max_packet_bytes, "
              "initial_rtt_s, key_update_packets=2**22): one path's data plane",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Channel_init,
    .tp_dealloc = (destructor)Channel_dealloc,
    .tp_methods = Channel_methods,
    .tp_getset = Channel_getset,
    .tp_as_sequence = &Channel_as_sequence,
};

wg_channel *wg_py_channel_of(PyObject *object) {
    if (!PyObject_TypeCheck(object, &wg_ChannelType)) {
        PyErr_SetString(PyExc_TypeError, "a PathChannel is needed");
        return NULL;
    }
    ChannelObject *channel = (ChannelObject *)object;
    if (!channel->ready) {
        PyErr_SetString(wg_LocalProtocolError, "the channel is not set up");
        return NULL;
    }
    return &channel->ch;
}

int wg_py_add_channel_types(PyObject *module) {
    if (wg_py_add_type(module, &wg_ReadDatagramsType, "ReadDatagrams") < 0) return -1;
    return wg_py_add_type(module, &wg_ChannelType, "PathChannel");
}
