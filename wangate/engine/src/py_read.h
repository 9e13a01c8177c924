/* Reading a socket in batches for Python: what PathChannel.read (a dialed path's own
 * socket) and ListenerReader.read (a listening socket every accepted path shares) have
 * in common.  A batch is read with one recvmmsg into buffers allocated once, each packet
 * opened where it lies by the channel that owns it; Python then gets bytes objects for
 * what the session handles, and the packets no channel owns (handshakes, garbage) as
 * they came, with their sender. */
#ifndef WG_PY_READ_H
#define WG_PY_READ_H

#include "wg_channel.h"
#include "wg_py.h"
#include "wg_reader.h"

/* the peer's faults in a packet that opened, as receive() raises and read() lists them */
extern const char wg_MALFORMED_FRAMES[];
extern const char wg_ACK_NEVER_SENT[];

/* One packet of a read: where it lies in the reader's buffers, the buffer it came in
 * (its sender), the route (channel) that opened it, and what the channel made of it. */
typedef struct {
    uint32_t off, len;
    uint32_t route;
    uint16_t buffer;
    uint16_t datagrams; /* DATAGRAM frames for the session (0 unless it opened well) */
    int result;
    uint16_t datagram_off[16], datagram_len[16]; /* wg_parsed's, from the frames' start */
} ReadPacket;

/* The most packets one read opens: 64 buffers of coalesced 1200-byte packets and more
 * fit; what a read holds beyond it (only packets under 1200 bytes coalesced, which our
 * sender never hands the kernel together) is dropped and counted, as a network loses. */
#define READ_PACKETS 4096

typedef struct {
    wg_reader reader;
    wg_parsed parsed; /* one packet's frames, copied out into its ReadPacket */
    uint64_t generation; /* this read's number (ReadDatagrams) */
    size_t packets;
    size_t coalesced_reads, read_overflow; /* of the last read */
    ReadPacket packet[READ_PACKETS];
} ReadBatch;

/* The channel that owns a packet (its route in *route), or NULL: not a data-plane
 * packet of any.  Called without the GIL: it may touch no Python object. */
typedef wg_channel *(*wg_pick_channel)(void *ctx, const uint8_t *packet, size_t len,
                                       uint32_t *route);

/* A batch reader, GRO asked for if `gro`; NULL with MemoryError set. */
ReadBatch *wg_py_batch_new(int fd, int gro);
void wg_py_batch_free(ReadBatch *b);

/* Read `fd` once (recvmmsg) and open every packet of the read with the channel `pick`
 * names, all without the GIL: the buffers read (0: nothing waiting), or -1 with an
 * OSError set. */
int wg_py_batch_read(ReadBatch *b, int fd, double now, wg_pick_channel pick, void *ctx);

/* Append what the session gets of packet `p` to `datagrams` (a ReadDatagrams with room
 * for them), `foreign` ((bytes, address) of a packet no channel owns) or `errors` (the
 * peer's faults, str): 0, or -1 with an exception set. */
int wg_py_append_packet(const ReadBatch *b, const ReadPacket *p, PyObject *datagrams,
                        PyObject *foreign, PyObject *errors);

/* ReadDatagrams: the DATAGRAM frames of one read (of one route), where they lie in the
 * batch's buffers: no bytes object each.  It holds `owner` (the reader, which frees its
 * batch only when it goes) and answers only until the batch's next read, after which
 * every use raises LocalProtocolError: the buffers then hold other packets.  A sequence
 * of bytes (each item a copy); place_shards reads it in place. */
typedef struct {
    PyObject_HEAD
    PyObject *owner;
    const ReadBatch *batch;
    uint64_t generation; /* the batch's read the frames are of */
    Py_ssize_t count, capacity;
    uint32_t *offset, *length; /* from the batch's reader.mem */
} ReadDatagramsObject;

extern PyTypeObject wg_ReadDatagramsType;

/* An empty ReadDatagrams with room for `capacity` frames of `batch`'s current read,
 * which `owner` keeps; NULL with an exception set. */
PyObject *wg_py_datagrams_new(PyObject *owner, const ReadBatch *batch, Py_ssize_t capacity);

/* The frames of a ReadDatagrams still current: their count, and each one's start and
 * length (base, offsets, lengths); -1 with LocalProtocolError set once stale. */
Py_ssize_t wg_py_datagrams_view(PyObject *datagrams, const uint8_t **base,
                                const uint32_t **offsets, const uint32_t **lengths);

/* PathChannel: the channel inside, or NULL with TypeError/LocalProtocolError set */
wg_channel *wg_py_channel_of(PyObject *object);

#endif
