/* wangate.engine._engine.ListenerReader: the data plane of every path accepted on one
 * listening socket, read in batches.
 *
 * The socket is shared, and connection IDs say whose a packet is (RFC 9000 §5.2): each
 * accepted path's channel is routed here by the ID its packets carry, so one recvmmsg
 * (with UDP GRO) serves them all and each packet is opened where it lies by its own
 * channel.  What no route claims (handshakes, aioquic's own packets, garbage) goes back
 * to Python as it came, with its sender. */
#include <string.h>

#include "py_read.h"

typedef struct {
    uint8_t cid[WG_CID_LEN];
    PyObject *channel; /* the PathChannel (a strong reference keeps `ch` alive) */
    wg_channel *ch;
    PyObject *owner; /* what read() names the channel's packets by */
    PyObject *group; /* during read(): its (owner, datagrams, errors), borrowed */
    Py_ssize_t datagrams; /* during read(): how many of the read's are its */
} Route;

typedef struct {
    PyObject_HEAD
    int fd;
    int gro;
    int reading; /* in read(), the GIL released: the routes may not change */
    Route *routes;
    size_t count, capacity;
    size_t last; /* the route the last packet took: the next is likely the same path's */
    ReadBatch *batch;
    unsigned long long coalesced_reads, read_overflow, foreign_packets;
} ReaderObject;

static int Reader_init(ReaderObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"fd", "gro", NULL};
    int fd, gro = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|p", kwlist, &fd, &gro)) return -1;
    if (fd < 0 || self->batch != NULL || self->count != 0) {
        PyErr_SetString(wg_LocalProtocolError, "ListenerReader(fd): a socket's descriptor, once");
        return -1;
    }
    self->fd = fd;
    self->gro = gro;
    return 0;
}

static void drop_route(Route *r) {
    Py_CLEAR(r->channel);
    Py_CLEAR(r->owner);
    r->ch = NULL;
    r->group = NULL;
}

static int Reader_clear(ReaderObject *self) {
    for (size_t i = 0; i < self->count; i++) drop_route(&self->routes[i]);
    self->count = 0;
    return 0;
}

static int Reader_traverse(ReaderObject *self, visitproc visit, void *arg) {
    for (size_t i = 0; i < self->count; i++) {
        Py_VISIT(self->routes[i].channel);
        Py_VISIT(self->routes[i].owner);
    }
    return 0;
}

static void Reader_dealloc(ReaderObject *self) {
    PyObject_GC_UnTrack(self);
    Reader_clear(self);
    PyMem_Free(self->routes);
    wg_py_batch_free(self->batch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int changing(ReaderObject *self) {
    if (self->reading) {
        PyErr_SetString(wg_LocalProtocolError, "routes cannot change while read() runs");
        return -1;
    }
    return 0;
}

static Py_ssize_t find(const ReaderObject *self, const uint8_t *cid) {
    for (size_t i = 0; i < self->count; i++)
        if (memcmp(self->routes[i].cid, cid, WG_CID_LEN) == 0) return (Py_ssize_t)i;
    return -1;
}

/* add(channel, owner): the packets carrying channel.recv_cid are opened by `channel`
 * and read() names them by `owner` */
static PyObject *Reader_add(ReaderObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add(channel, owner)");
        return NULL;
    }
    wg_channel *ch = wg_py_channel_of(args[0]);
    if (ch == NULL || changing(self) < 0) return NULL;
    if (find(self, ch->recv_cid) >= 0) {
        PyErr_SetString(wg_LocalProtocolError, "a channel with that connection ID is routed");
        return NULL;
    }
    if (self->count == self->capacity) {
        size_t capacity = self->capacity ? 2 * self->capacity : 8;
        Route *routes = PyMem_Realloc(self->routes, capacity * sizeof(Route));
        if (routes == NULL) return PyErr_NoMemory();
        self->routes = routes;
        self->capacity = capacity;
    }
    Route *r = &self->routes[self->count++];
    memcpy(r->cid, ch->recv_cid, WG_CID_LEN);
    r->ch = ch;
    r->channel = Py_NewRef(args[0]);
    r->owner = Py_NewRef(args[1]);
    r->group = NULL;
    Py_RETURN_NONE;
}

/* remove(cid) -> whether a route went */
static PyObject *Reader_remove(ReaderObject *self, PyObject *arg) {
    Py_buffer cid;
    if (PyObject_GetBuffer(arg, &cid, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t at = cid.len == WG_CID_LEN ? find(self, cid.buf) : -1;
    PyBuffer_Release(&cid);
    if (at < 0) Py_RETURN_FALSE;
    if (changing(self) < 0) return NULL;
    Route gone = self->routes[at];
    self->routes[at] = self->routes[--self->count]; /* order does not matter */
    drop_route(&gone);
    Py_RETURN_TRUE;
}

/* Whose a packet is: a short header carrying a routed ID.  Runs without the GIL. */
static wg_channel *route_of(void *ctx, const uint8_t *packet, size_t len, uint32_t *route) {
    ReaderObject *self = ctx;
    if (len < 1 + WG_CID_LEN || packet[0] & 0x80) return NULL;
    const uint8_t *cid = packet + 1;
    if (self->last < self->count && memcmp(self->routes[self->last].cid, cid, WG_CID_LEN) == 0) {
        *route = (uint32_t)self->last;
        return self->routes[self->last].ch;
    }
    Py_ssize_t at = find(self, cid);
    if (at < 0) return NULL;
    self->last = (size_t)at;
    *route = (uint32_t)at;
    return self->routes[at].ch;
}

static PyObject *group_of(ReaderObject *self, Route *r, PyObject *groups) {
    if (r->group != NULL) return r->group;
    PyObject *group = Py_BuildValue(
        "(ONN)", r->owner, wg_py_datagrams_new((PyObject *)self, self->batch, r->datagrams),
        PyList_New(0));
    if (group == NULL) return NULL;
    int rc = PyList_Append(groups, group);
    Py_DECREF(group); /* the list keeps it */
    return rc < 0 ? NULL : (r->group = group);
}

/* read(now) -> (groups, foreign, buffers, packets): one recvmmsg of up to WG_READ_BATCH
 * buffers, cut into their packets (UDP GRO), each opened where it lies by its route's
 * channel, without the GIL; groups: (owner, datagrams, errors) for each route with
 * packets, in the order of their first; foreign: (bytes, address) of the packets no
 * route claims; packets counts every one, dropped ones too (what the read cost). */
static PyObject *Reader_read(ReaderObject *self, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    if (changing(self) < 0) return NULL;
    if (self->batch == NULL && (self->batch = wg_py_batch_new(self->fd, self->gro)) == NULL)
        return NULL;
    ReadBatch *b = self->batch;
    self->reading = 1;
    int n = wg_py_batch_read(b, self->fd, now, route_of, self);
    self->reading = 0;
    self->coalesced_reads += b->coalesced_reads;
    self->read_overflow += b->read_overflow;
    if (n < 0) return NULL;
    for (size_t i = 0; i < self->count; i++) self->routes[i].datagrams = 0;
    for (size_t k = 0; k < b->packets; k++) { /* a packet with datagrams has a route */
        const ReadPacket *p = &b->packet[k];
        if (p->datagrams) self->routes[p->route].datagrams += p->datagrams;
    }
    PyObject *groups = PyList_New(0), *foreign = PyList_New(0);
    if (groups == NULL || foreign == NULL) goto fail;
    for (size_t k = 0; k < b->packets; k++) {
        const ReadPacket *p = &b->packet[k];
        if (p->result == WG_RECEIVE_NOT_MINE) {
            self->foreign_packets++;
            if (wg_py_append_packet(b, p, NULL, foreign, NULL) < 0) goto fail;
            continue;
        }
        PyObject *group = group_of(self, &self->routes[p->route], groups);
        if (group == NULL || wg_py_append_packet(b, p, PyTuple_GET_ITEM(group, 1), foreign,
                                                 PyTuple_GET_ITEM(group, 2)) < 0)
            goto fail;
    }
    for (size_t i = 0; i < self->count; i++) self->routes[i].group = NULL;
    return Py_BuildValue("(NNin)", groups, foreign, n, (Py_ssize_t)b->packets);
fail:
    for (size_t i = 0; i < self->count; i++) self->routes[i].group = NULL;
    Py_XDECREF(groups);
    Py_XDECREF(foreign);
    return NULL;
}

#define STAT(name)                                                                        \
    if (PyDict_SetItemString(d, #name, v = PyLong_FromUnsignedLongLong(self->name)) < 0) \
        goto fail;                                                                        \
    Py_DECREF(v);

static PyObject *Reader_stats(ReaderObject *self, PyObject *unused) {
    PyObject *d = PyDict_New(), *v = NULL;
    if (d == NULL) return NULL;
    STAT(coalesced_reads) STAT(read_overflow) STAT(foreign_packets)
    return d;
fail:
    Py_XDECREF(v);
    Py_DECREF(d);
    return NULL;
}

static Py_ssize_t Reader_len(ReaderObject *self) { return (Py_ssize_t)self->count; }

static PyObject *Reader_get_gro(ReaderObject *self, void *unused) {
    return PyBool_FromLong(self->gro && (self->batch == NULL || self->batch->reader.gro));
}

static PyMethodDef Reader_methods[] = {
    {"add", (PyCFunction)(void (*)(void))Reader_add, METH_FASTCALL,
     "add(channel, owner): packets carrying channel.recv_cid are its, named by owner"},
    {"remove", (PyCFunction)Reader_remove, METH_O,
     "remove(cid) -> bool: that connection ID's route is gone (False: there was none)"},
    {"read", (PyCFunction)Reader_read, METH_O,
     "read(now) -> (groups, foreign, buffers, packets): a batch from the socket, by route"},
    {"stats", (PyCFunction)Reader_stats, METH_NOARGS, "stats() -> dict of counters"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Reader_getset[] = {
    {"gro", (getter)Reader_get_gro, NULL,
     "read() takes the kernel's coalesced buffers (UDP GRO, where the kernel has it)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Reader_as_sequence = {.sq_length = (lenfunc)Reader_len};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wangate.engine._engine.ListenerReader",
    .tp_basicsize = sizeof(ReaderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "ListenerReader(fd, gro=True): the data plane of the paths a listening socket "
              "accepted, read in batches and routed by connection ID",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_traverse = (traverseproc)Reader_traverse,
    .tp_clear = (inquiry)Reader_clear,
    .tp_methods = Reader_methods,
    .tp_getset = Reader_getset,
    .tp_as_sequence = &Reader_as_sequence,
};

int wg_py_add_listener_types(PyObject *module) {
    return wg_py_add_type(module, &ReaderType, "ListenerReader");
}
