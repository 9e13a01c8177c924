/* Batches read from a socket for Python (py_read.h). */
#include "py_read.h"

#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

const char wg_MALFORMED_FRAMES[] = "malformed frames in a data-plane packet";
const char wg_ACK_NEVER_SENT[] = "an ACK of a packet never sent (RFC 9000 §13.1)";

ReadBatch *wg_py_batch_new(int fd, int gro) {
    ReadBatch *b = PyMem_Calloc(1, sizeof(ReadBatch));
    if (b == NULL || wg_reader_init(&b->reader) < 0) {
        PyMem_Free(b);
        PyErr_NoMemory();
        return NULL;
    }
    /* a kernel without UDP GRO reads plain datagrams */
    if (gro) (void)wg_reader_set_gro(&b->reader, fd, 1);
    return b;
}

void wg_py_batch_free(ReadBatch *b) {
    if (b == NULL) return;
    wg_reader_free(&b->reader);
    PyMem_Free(b);
}

/* Open the packets of buffers [0, n) where they lie, cutting coalesced buffers at their
 * segment size.  Runs without the GIL. */
static void open_read(ReadBatch *b, int n, double now, wg_pick_channel pick, void *ctx) {
    size_t k = 0;
    b->coalesced_reads = b->read_overflow = 0;
    for (int i = 0; i < n; i++) {
        uint8_t *data = wg_reader_data(&b->reader, i);
        size_t len = b->reader.msgs[i].msg_len, segment = wg_reader_segment_bytes(&b->reader, i);
        size_t at = 0;
        if (segment < len) b->coalesced_reads++;
        do { /* an empty datagram is one packet too: it goes back as not ours */
            size_t plen = len - at < segment ? len - at : segment;
            if (k == READ_PACKETS) {
                b->read_overflow++;
            } else {
                ReadPacket *p = &b->packet[k++];
                p->off = (uint32_t)((size_t)i * WG_READ_BUFFER_BYTES + at);
                p->len = (uint32_t)plen;
                p->buffer = (uint16_t)i;
                p->route = 0;
                p->datagrams = 0;
                wg_channel *ch = pick(ctx, data + at, plen, &p->route);
                p->result = ch == NULL ? WG_RECEIVE_NOT_MINE
                                       : wg_channel_receive_in_place(ch, data + at, plen, now,
                                                                     &b->parsed);
                for (int j = 0; j < p->result && j < 16; j++) {
                    p->datagram_off[j] = (uint16_t)b->parsed.datagram_off[j];
                    p->datagram_len[j] = (uint16_t)b->parsed.datagram_len[j];
                    p->datagrams++;
                }
            }
            at += plen;
        } while (at < len);
    }
    b->packets = k;
}

int wg_py_batch_read(ReadBatch *b, int fd, double now, wg_pick_channel pick, void *ctx) {
    int n, read_errno = 0;
    b->generation++; /* with the GIL held: what a ReadDatagrams checks */
    Py_BEGIN_ALLOW_THREADS
    n = wg_reader_read(&b->reader, fd);
    if (n < 0) read_errno = errno;
    open_read(b, n < 0 ? 0 : n, now, pick, ctx);
    Py_END_ALLOW_THREADS
    if (n < 0) {
        errno = read_errno;
        PyErr_SetFromErrno(PyExc_OSError);
    }
    return n;
}

static PyObject *address_tuple(const struct sockaddr_storage *addr) {
    char host[INET6_ADDRSTRLEN];
    if (addr->ss_family == AF_INET) {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)addr;
        if (inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host)) == NULL) goto unknown;
        return Py_BuildValue("(si)", host, (int)ntohs(v4->sin_port));
    }
    if (addr->ss_family == AF_INET6) {
        const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)addr;
        if (inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host)) == NULL) goto unknown;
        return Py_BuildValue("(siII)", host, (int)ntohs(v6->sin6_port),
                             (unsigned)ntohl(v6->sin6_flowinfo), (unsigned)v6->sin6_scope_id);
    }
unknown:
    PyErr_Format(wg_LocalProtocolError, "a datagram from an address of family %d",
                 (int)addr->ss_family);
    return NULL;
}

static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL) return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

int wg_py_append_packet(const ReadBatch *b, const ReadPacket *p, PyObject *datagrams,
                        PyObject *foreign, PyObject *errors) {
    const uint8_t *data = b->reader.mem + p->off;
    switch (p->result) {
    case WG_RECEIVE_NOT_MINE: {
        PyObject *address = address_tuple(&b->reader.addr[p->buffer]);
        if (address == NULL) return -1;
        return append_new(foreign,
                          Py_BuildValue("(y#N)", (const char *)data, (Py_ssize_t)p->len, address));
    }
    case WG_RECEIVE_DROPPED:
        return 0;
    case WG_RECEIVE_MALFORMED:
        return append_new(errors, PyUnicode_FromString(wg_MALFORMED_FRAMES));
    case WG_RECEIVE_BAD_ACK:
        return append_new(errors, PyUnicode_FromString(wg_ACK_NEVER_SENT));
    default:
        break;
    }
    ReadDatagramsObject *d = (ReadDatagramsObject *)datagrams;
    if (d->capacity - d->count < p->datagrams) {
        PyErr_SetString(PyExc_SystemError, "ReadDatagrams sized too small for its read");
        return -1;
    }
    for (int j = 0; j < p->datagrams; j++, d->count++) {
        d->offset[d->count] = p->off + WG_SHORT_HEADER_LEN + p->datagram_off[j];
        d->length[d->count] = p->datagram_len[j];
    }
    return 0;
}

/* ---------------------------------------------------------------- ReadDatagrams */

PyObject *wg_py_datagrams_new(PyObject *owner, const ReadBatch *batch, Py_ssize_t capacity) {
    if (batch == NULL || capacity < 0) {
        PyErr_SetString(PyExc_SystemError, "ReadDatagrams of no read");
        return NULL;
    }
    ReadDatagramsObject *d = PyObject_New(ReadDatagramsObject, &wg_ReadDatagramsType);
    if (d == NULL) return NULL;
    d->owner = NULL;
    /* each frame's offset, then each one's length: one block */
    size_t room = (size_t)(capacity > 0 ? capacity : 1);
    d->offset = PyMem_Malloc(sizeof(uint32_t) * 2 * room);
    if (d->offset == NULL) {
        Py_DECREF(d);
        return PyErr_NoMemory();
    }
    d->length = d->offset + room;
    d->capacity = capacity;
    Py_INCREF(owner);
    d->owner = owner;
    d->batch = batch;
    d->generation = batch->generation;
    d->count = 0;
    return (PyObject *)d;
}

/* the read's buffers, or NULL with LocalProtocolError set: the batch was read again */
static const uint8_t *current(ReadDatagramsObject *d) {
    if (d->batch->generation != d->generation) {
        PyErr_SetString(wg_LocalProtocolError,
                        "these datagrams were read before the reader's latest read, which "
                        "reused their buffers: take what is needed before reading again");
        return NULL;
    }
    return d->batch->reader.mem;
}

Py_ssize_t wg_py_datagrams_view(PyObject *datagrams, const uint8_t **base,
                                const uint32_t **offsets, const uint32_t **lengths) {
    ReadDatagramsObject *d = (ReadDatagramsObject *)datagrams;
    if ((*base = current(d)) == NULL) return -1;
    *offsets = d->offset;
    *lengths = d->length;
    return d->count;
}

static void ReadDatagrams_dealloc(ReadDatagramsObject *d) {
    Py_XDECREF(d->owner);
    PyMem_Free(d->offset);
    PyObject_Free(d);
}

static Py_ssize_t ReadDatagrams_len(ReadDatagramsObject *d) { return d->count; }

static PyObject *ReadDatagrams_item(ReadDatagramsObject *d, Py_ssize_t i) {
    if (i < 0 || i >= d->count) {
        PyErr_SetString(PyExc_IndexError, "ReadDatagrams index out of range");
        return NULL;
    }
    const uint8_t *base = current(d);
    if (base == NULL) return NULL;
    return PyBytes_FromStringAndSize((const char *)base + d->offset[i], d->length[i]);
}

static PySequenceMethods ReadDatagrams_as_sequence = {
    .sq_length = (lenfunc)ReadDatagrams_len,
    .sq_item = (ssizeargfunc)ReadDatagrams_item,
};

PyTypeObject wg_ReadDatagramsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wangate.engine._engine.ReadDatagrams",
    .tp_basicsize = sizeof(ReadDatagramsObject),
    .tp_dealloc = (destructor)ReadDatagrams_dealloc,
    .tp_as_sequence = &ReadDatagrams_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The DATAGRAM frames of one read, in the reader's buffers until its next read: "
              "len(), [i] (bytes), iteration; place_shards reads them in place.",
};
