/* One path's data plane: sealed QUIC short-header packets carrying DATAGRAM and ACK
 * frames, over a UDP socket the caller owns (proto/engine.md).
 *
 * The caller queues datagrams (copied into a fixed ring: nothing is allocated per
 * datagram), then flushes: packets are built while the congestion window and the
 * pacer allow, sealed, and sent in batches with sendmmsg.  Received packets are
 * matched by connection ID, checked for replay before the AEAD runs, opened, and
 * their frames acted on: ACKs feed loss recovery, DATAGRAM data goes back to the
 * caller.  A channel with a socket of its own may read it too, in batches (wg_reader.h).
 *
 * Key phases (RFC 9001 §6): a sender updates its keys after `key_update_packets`
 * packets, far below AES-GCM's confidentiality limit of 2^23 packets (§6.6), and only
 * once the peer acknowledged a packet of the current phase (§6.1).  A receiver that
 * sees the next phase opens it with the precomputed next keys, then updates its own
 * send keys too (§6.2); the previous receive keys stay for packets reordered across
 * the update.
 */
#ifndef WG_CHANNEL_H
#define WG_CHANNEL_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "wg_frames.h"
#include "wg_keys.h"
#include "wg_packet.h"
#include "wg_received.h"
#include "wg_recovery.h"
#include "wg_span.h"

#define WG_BATCH_PACKETS 64      /* packets per sendmmsg */
/* UDP GSO (UDP_SEGMENT): equal packets of a batch go to the kernel as one buffer it
 * cuts, at most this many and this much (the IPv4 payload limit) at a time; packets
 * under 1200 bytes (ACKs, probes) go alone, so a receiver never sees them coalesced */
#define WG_GSO_MAX_SEGMENTS 64
#define WG_GSO_MAX_BYTES 65507
#define WG_QUEUE_SLOTS 256       /* datagrams queued before a flush */
#define WG_UNPACED_RTT_S 0.002   /* paths shorter than this are not paced (wg_channel.c) */
#define WG_MAX_PACKET_BYTES 65527 /* largest UDP payload over IPv4 */
#define WG_MIN_PACKET_BYTES 1200 /* RFC 9000 §14: every path carries this much */
#define WG_ACK_DELAY_EXPONENT 3  /* RFC 9000 §18.2's default */
/* what this receiver promises (ack every second packet, else after this); the
 * sender's probe timeout adds its own allowance for a busy host */
#define WG_LOCAL_ACK_DELAY_S 0.001
#define WG_PEER_MAX_ACK_DELAY_S 0.005
#define WG_DEFAULT_KEY_UPDATE_PACKETS (1ULL << 22)
/* an ACK frame beside a full datagram: type, largest (4), delay (2), count, first
 * range (2); a longer one goes in a packet of its own */
#define WG_ACK_ROOM_BYTES 10
/* what a packet adds to its datagram: header and tag, the frame type, the ACK room */
#define WG_DATAGRAM_OVERHEAD (WG_PACKET_OVERHEAD + 1 + WG_ACK_ROOM_BYTES)

typedef struct wg_channel_stats {
    uint64_t packets_sent, packets_received, bytes_sent, bytes_received;
    uint64_t datagrams_sent, datagrams_received;
    uint64_t acked_packets, lost_packets, lost_bytes;
    uint64_t not_opened;   /* failed the AEAD: forged, damaged, or a stale key */
    uint64_t replayed;     /* duplicates and packets older than the replay window */
    uint64_t send_dropped; /* the socket's buffer was full: lost as a network loses them */
    uint64_t send_errors;
    uint64_t key_updates;
    uint64_t probes_sent;
    uint64_t segmented_sends; /* buffers the kernel cut into packets (UDP GSO) */
    uint64_t coalesced_reads; /* buffers of several packets read (UDP GRO) */
    uint64_t read_overflow;   /* packets past what one read opens (PathChannel.read) */
} wg_channel_stats;

typedef struct wg_channel {
    int fd;
    int gso; /* hand equal packets to the kernel to cut (UDP_SEGMENT); off once it refuses */
    struct sockaddr_storage peer;
    socklen_t peer_len;
    size_t max_packet_bytes;
    uint8_t send_cid[WG_CID_LEN]; /* the peer receives on it */
    uint8_t recv_cid[WG_CID_LEN];
    int suite;
    /* sending keys */
    wg_secret send_secret;
    wg_aead send_aead;
    wg_hp send_hp;
    int send_phase;
    uint64_t send_phase_first_pn;
    uint64_t key_update_packets;
    /* receiving keys */
    wg_secret recv_next_secret; /* of recv_next */
    wg_aead recv_cur, recv_next, recv_prev;
    int has_prev;
    wg_hp recv_hp;
    int recv_phase;
    uint64_t recv_phase_first_pn;
    wg_recovery recovery;
    wg_received received;
    /* queued datagrams: slot i holds queue_len[i] bytes at queue_mem + i * queue_stride;
     * the strides stay as set up while the limits may only shrink (wg_channel_fit) */
    size_t max_datagram_bytes, queue_stride, batch_stride;
    uint8_t *queue_mem;
    uint16_t *queue_len;
    size_t queue_head, queue_count;
    int probes_due;
    /* the batch being built */
    uint8_t *batch_mem;
    size_t batch_count;
    size_t batch_len[WG_BATCH_PACKETS];
    uint8_t *scratch; /* one received packet, opened */
    wg_channel_stats stats;
} wg_channel;

/* `send_secret` / `recv_secret`: this path's TLS 1.3 application traffic secrets
 * (ours and the peer's); the data plane's own are derived from them.  0, or -1 with
 * *why set to a static message. */
int wg_channel_init(wg_channel *ch, int fd, const struct sockaddr *peer, socklen_t peer_len,
                    int suite, const uint8_t *send_secret, size_t send_len,
                    const uint8_t *recv_secret, size_t recv_len, size_t max_packet_bytes,
                    double initial_rtt_s, uint64_t key_update_packets, const char **why);
void wg_channel_free(wg_channel *ch);

/* Packets of at most `max_packet_bytes` from now on (never more than set up with, nor
 * under 1200).  0, or -1 if out of range. */
int wg_channel_fit(wg_channel *ch, size_t max_packet_bytes);

/* copy one datagram into the queue: 1, or 0 when the queue is full, -1 when it is
 * larger than max_datagram_bytes */
int wg_channel_queue(wg_channel *ch, const uint8_t *data, size_t len);
/* frame a checked span's `count` datagrams straight into the queue (its longest at most
 * max_datagram_bytes): how many went in, fewer when the queue filled up */
size_t wg_channel_queue_span(wg_channel *ch, const wg_span *span, size_t count);
/* send what the window and pacer allow, ACKs and probes included; returns packets sent */
size_t wg_channel_flush(wg_channel *ch, double now);

enum {
    WG_RECEIVE_NOT_MINE = -1, /* not this channel's connection ID: someone else's */
    WG_RECEIVE_DROPPED = -2,  /* replayed, too old or not opened: counted, nothing more */
    WG_RECEIVE_MALFORMED = -3, /* opened, but its frames are malformed: the peer's fault */
    WG_RECEIVE_BAD_ACK = -4,   /* acknowledges a packet never sent (RFC 9000 §13.1) */
};
/* One received UDP datagram.  Returns the number of DATAGRAM frames it held (their
 * data in ch->scratch at *parsed's offsets), or a WG_RECEIVE_* code. */
int wg_channel_receive(wg_channel *ch, const uint8_t *data, size_t len, double now,
                       wg_parsed *parsed);
/* The same, opened where it lies: `buf` holds the packet and is overwritten from its
 * header on (a packet that is not this channel's is left as it was); the DATAGRAM
 * frames' data is then at buf + WG_SHORT_HEADER_LEN plus *parsed's offsets. */
int wg_channel_receive_in_place(wg_channel *ch, uint8_t *buf, size_t len, double now,
                                wg_parsed *parsed);
/* the next time the channel needs a call (on_timer or flush), or < 0 for none */
double wg_channel_timer(wg_channel *ch, double now);
void wg_channel_on_timer(wg_channel *ch, double now);

#endif
