/* A path's data plane (wg_channel.h): building, sealing, sending, and receiving. */
#include "wg_channel.h"

#include <errno.h>
#include <netinet/udp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103 /* Linux 4.18 */
#endif

/* ------------------------------------------------------------------ keys */

static void free_keys(wg_channel *ch) {
    wg_aead_free(&ch->send_aead);
    wg_hp_free(&ch->send_hp);
    wg_aead_free(&ch->recv_cur);
    wg_aead_free(&ch->recv_next);
    wg_aead_free(&ch->recv_prev);
    wg_hp_free(&ch->recv_hp);
}

/* the sender moves to the next key phase (§6.1), or follows the peer there (§6.2) */
static int next_send_phase(wg_channel *ch) {
    wg_secret next;
    wg_aead aead = {0};
    if (wg_secret_next(&ch->send_secret, &next) < 0 || wg_aead_init(&aead, &next, 1) < 0) {
        wg_aead_free(&aead);
        return -1;
    }
    wg_aead_free(&ch->send_aead);
    ch->send_aead = aead;
    ch->send_secret = next;
    ch->send_phase ^= 1;
    ch->send_phase_first_pn = ch->recovery.next_pn;
    ch->stats.key_updates++;
    return 0;
}

/* the peer's packets of the next phase opened: the receive keys move along */
static int next_recv_phase(wg_channel *ch, uint64_t pn) {
    wg_secret after;
    wg_aead aead = {0};
    if (wg_secret_next(&ch->recv_next_secret, &after) < 0 || wg_aead_init(&aead, &after, 0) < 0) {
        wg_aead_free(&aead);
        return -1;
    }
    wg_aead_free(&ch->recv_prev);
    ch->recv_prev = ch->recv_cur;
    ch->has_prev = 1;
    ch->recv_cur = ch->recv_next;
    ch->recv_next = aead;
    ch->recv_next_secret = after;
    ch->recv_phase ^= 1;
    ch->recv_phase_first_pn = pn;
    return 0;
}

/* A packet of ours that carried an ACK was acknowledged: what that ACK said needs no
 * saying again (RFC 9000 §13.2.4).  The token is the ACK's largest + 1, 0 for none. */
static void ack_delivered(void *ctx, uint64_t pn, const wg_sent *packet) {
    wg_channel *ch = ctx;
    if (packet->token > 0) wg_received_forget(&ch->received, packet->token - 1);
}

int wg_channel_init(wg_channel *ch, int fd, const struct sockaddr *peer, socklen_t peer_len,
                    int suite, const uint8_t *send_secret, size_t send_len,
                    const uint8_t *recv_secret, size_t recv_len, size_t max_packet_bytes,
                    double initial_rtt_s, uint64_t key_update_packets, const char **why) {
    memset(ch, 0, sizeof(*ch));
    ch->fd = fd;
    ch->gso = 1;
    if (peer_len > sizeof(ch->peer)) {
        *why = "peer address too long";
        return -1;
    }
    if (max_packet_bytes < WG_MIN_PACKET_BYTES || max_packet_bytes > WG_MAX_PACKET_BYTES) {
        *why = "max_packet_bytes must be within 1200..65527";
        return -1;
    }
    memcpy(&ch->peer, peer, peer_len);
    ch->peer_len = peer_len;
    ch->max_packet_bytes = max_packet_bytes;
    ch->suite = suite;
    ch->key_update_packets = key_update_packets ? key_update_packets : 1;
    wg_secret recv_cur;
    if (wg_data_plane_derive(suite, send_secret, send_len, &ch->send_secret, ch->send_cid) < 0 ||
        wg_data_plane_derive(suite, recv_secret, recv_len, &recv_cur, ch->recv_cid) < 0) {
        *why = "unknown cipher suite, or a secret of the wrong length";
        return -1;
    }
    if (wg_aead_init(&ch->send_aead, &ch->send_secret, 1) < 0 ||
        wg_hp_init(&ch->send_hp, &ch->send_secret) < 0 ||
        wg_aead_init(&ch->recv_cur, &recv_cur, 0) < 0 || wg_hp_init(&ch->recv_hp, &recv_cur) < 0 ||
        wg_secret_next(&recv_cur, &ch->recv_next_secret) < 0 ||
        wg_aead_init(&ch->recv_next, &ch->recv_next_secret, 0) < 0) {
        free_keys(ch);
        *why = "libcrypto could not set up the keys";
        return -1;
    }
    ch->max_datagram_bytes = max_packet_bytes - WG_DATAGRAM_OVERHEAD;
    ch->queue_stride = ch->max_datagram_bytes;
    ch->batch_stride = max_packet_bytes;
    ch->queue_mem = malloc(WG_QUEUE_SLOTS * ch->queue_stride);
    ch->queue_len = calloc(WG_QUEUE_SLOTS, sizeof(uint16_t));
    ch->batch_mem = malloc(WG_BATCH_PACKETS * max_packet_bytes);
    ch->scratch = malloc(WG_MAX_PACKET_BYTES);
    if (!ch->queue_mem || !ch->queue_len || !ch->batch_mem || !ch->scratch ||
        wg_recovery_init(&ch->recovery, 4096, max_packet_bytes, initial_rtt_s,
                         WG_PEER_MAX_ACK_DELAY_S) < 0) {
        wg_channel_free(ch);
        *why = "out of memory";
        return -1;
    }
    wg_received_init(&ch->received);
    ch->recovery.on_acked = ack_delivered;
    ch->recovery.on_acked_ctx = ch;
    return 0;
}

void wg_channel_free(wg_channel *ch) {
    free_keys(ch);
    wg_recovery_free(&ch->recovery);
    free(ch->queue_mem);
    free(ch->queue_len);
    free(ch->batch_mem);
    free(ch->scratch);
    ch->queue_mem = ch->batch_mem = ch->scratch = NULL;
    ch->queue_len = NULL;
}

/* ------------------------------------------------------------- sending */

int wg_channel_fit(wg_channel *ch, size_t max_packet_bytes) {
    if (max_packet_bytes < WG_MIN_PACKET_BYTES || max_packet_bytes > ch->batch_stride) return -1;
    /* what is queued already was sized for the old limit: it goes out as it is */
    ch->max_packet_bytes = max_packet_bytes;
    ch->max_datagram_bytes = max_packet_bytes - WG_DATAGRAM_OVERHEAD;
    return 0;
}

int wg_channel_queue(wg_channel *ch, const uint8_t *data, size_t len) {
    if (len > ch->max_datagram_bytes) return -1;
    if (ch->queue_count == WG_QUEUE_SLOTS) return 0;
    size_t slot = (ch->queue_head + ch->queue_count) % WG_QUEUE_SLOTS;
    memcpy(ch->queue_mem + slot * ch->queue_stride, data, len);
    ch->queue_len[slot] = (uint16_t)len;
    ch->queue_count++;
    return 1;
}

size_t wg_channel_queue_span(wg_channel *ch, const wg_span *span, size_t count) {
    size_t queued = 0;
    for (; queued < count && ch->queue_count < WG_QUEUE_SLOTS; queued++) {
        size_t slot = (ch->queue_head + ch->queue_count) % WG_QUEUE_SLOTS;
        uint8_t *at = ch->queue_mem + slot * ch->queue_stride;
        ch->queue_len[slot] = (uint16_t)wg_span_write(span, queued, at);
        ch->queue_count++;
    }
    return queued;
}

typedef union {
    char buf[CMSG_SPACE(sizeof(uint16_t))];
    struct cmsghdr align;
} gso_control;

/* The batch's packets from `from` on as sendmmsg messages: a run of equal packets (the
 * last may be shorter) as one buffer with its segment size when GSO is on, else one
 * packet a message.  first[m] is the first packet of message m; returns the count. */
static size_t batch_messages(wg_channel *ch, size_t from, struct mmsghdr *msgs,
                             struct iovec *iov, gso_control *control, size_t *first) {
    size_t count = ch->batch_count, m = 0;
    for (size_t i = from; i < count; m++) {
        size_t segment = ch->batch_len[i], n = 1, total = segment;
        if (ch->gso && segment >= WG_MIN_PACKET_BYTES) {
            while (i + n < count && n < WG_GSO_MAX_SEGMENTS && ch->batch_len[i + n] <= segment &&
                   total + ch->batch_len[i + n] <= WG_GSO_MAX_BYTES) {
                total += ch->batch_len[i + n++];
                if (ch->batch_len[i + n - 1] < segment) break; /* a shorter one ends a run */
            }
        }
        struct msghdr *hdr = &msgs[m].msg_hdr;
        memset(&msgs[m], 0, sizeof(msgs[m]));
        hdr->msg_name = &ch->peer;
        hdr->msg_namelen = ch->peer_len;
        hdr->msg_iov = &iov[i];
        hdr->msg_iovlen = n;
        if (n > 1) {
            memset(&control[m], 0, sizeof(control[m]));
            hdr->msg_control = control[m].buf;
            hdr->msg_controllen = sizeof(control[m].buf);
            struct cmsghdr *cmsg = CMSG_FIRSTHDR(hdr);
            cmsg->cmsg_level = IPPROTO_UDP;
            cmsg->cmsg_type = UDP_SEGMENT;
            cmsg->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t size = (uint16_t)segment;
            memcpy(CMSG_DATA(cmsg), &size, sizeof(size));
        }
        first[m] = i;
        i += n;
    }
    return m;
}

static void send_batch(wg_channel *ch) {
    struct mmsghdr msgs[WG_BATCH_PACKETS];
    struct iovec iov[WG_BATCH_PACKETS];
    gso_control control[WG_BATCH_PACKETS];
    size_t first[WG_BATCH_PACKETS];
    size_t count = ch->batch_count;
    for (size_t i = 0; i < count; i++) {
        iov[i].iov_base = ch->batch_mem + i * ch->batch_stride;
        iov[i].iov_len = ch->batch_len[i];
    }
    size_t messages = batch_messages(ch, 0, msgs, iov, control, first), done = 0;
    while (done < messages) {
        int n = sendmmsg(ch->fd, msgs + done, (unsigned)(messages - done), 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            if ((errno == EIO || errno == EINVAL) && msgs[done].msg_hdr.msg_controllen > 0) {
                /* the kernel or the route cannot segment (no checksum offload, a path
                 * MTU under the packet size): plain messages from now on */
                ch->gso = 0;
                messages = batch_messages(ch, first[done], msgs, iov, control, first);
                done = 0;
                continue;
            }
            size_t unsent = count - first[done];
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)
                ch->stats.send_dropped += unsent;
            else
                ch->stats.send_errors += unsent;
            break; /* recorded as sent: recovery declares them lost, as for the network */
        }
        for (int k = 0; k < n; k++)
            if (msgs[done + (size_t)k].msg_hdr.msg_controllen > 0) ch->stats.segmented_sends++;
        done += (size_t)n;
    }
    ch->batch_count = 0;
}

/* Build and seal one packet into the batch: an ACK if owed (when `with_ack`), a PING
 * for a probe, the next queued datagram if `datagram`.  0, or -1 if sealing failed. */
static int build_packet(wg_channel *ch, double now, int with_ack, int ping, int datagram) {
    uint8_t *buf = ch->batch_mem + ch->batch_count * ch->batch_stride;
    size_t data_len = datagram ? ch->queue_len[ch->queue_head] : 0;
    /* a datagram queued before the limit shrank still goes out whole */
    size_t cap = ch->max_packet_bytes;
    if (WG_PACKET_OVERHEAD + 1 + data_len > cap) cap = ch->batch_stride;
    size_t room = cap - WG_PACKET_OVERHEAD;
    uint64_t pn = ch->recovery.next_pn;
    wg_short_header(buf, ch->send_cid, ch->send_phase, pn);
    uint8_t *frames = buf + WG_SHORT_HEADER_LEN;
    size_t off = 0;
    int acked = 0;
    uint64_t token = 0;
    if (with_ack) {
        wg_ack ack;
        if (wg_received_ack(&ch->received, &ack, now, WG_ACK_DELAY_EXPONENT)) {
            size_t ack_room = datagram ? room - 1 - data_len : room;
            size_t n = wg_ack_encode(&ack, frames, ack_room);
            if (n > 0) {
                off += n;
                acked = 1;
                token = ack.ranges[0].largest + 1;
            }
        }
    }
    if (ping) frames[off++] = WG_FRAME_PING;
    if (datagram) {
        frames[off++] = WG_FRAME_DATAGRAM; /* to the packet's end: no length (RFC 9221 §4) */
        memcpy(frames + off, ch->queue_mem + ch->queue_head * ch->queue_stride, data_len);
        off += data_len;
    }
    /* RFC 9000 §12.4: a packet holds at least one frame.  (Header protection's sample,
     * 4 bytes past the packet number's start, RFC 9001 §5.4.2, always exists: the
     * packet number takes 4 bytes and the tag 16.) */
    if (off == 0) return -1;
    long sealed = wg_packet_seal(&ch->send_aead, &ch->send_hp, pn, buf, off, cap);
    if (sealed < 0) return -1;
    int eliciting = ping || datagram;
    if (wg_recovery_on_sent(&ch->recovery, (size_t)sealed, eliciting, token, now) < 0) return -1;
    if (eliciting) wg_pacer_update_after_send(&ch->recovery.pacer, now); /* a no-op in burst */
    if (acked) wg_received_ack_sent(&ch->received);
    if (datagram) {
        ch->queue_head = (ch->queue_head + 1) % WG_QUEUE_SLOTS;
        ch->queue_count--;
        ch->stats.datagrams_sent++;
    }
    if (ping) ch->stats.probes_sent++;
    ch->batch_len[ch->batch_count++] = (size_t)sealed;
    ch->stats.packets_sent++;
    ch->stats.bytes_sent += (uint64_t)sealed;
    if (ch->batch_count == WG_BATCH_PACKETS) send_batch(ch);
    return 0;
}

/* §6.1: a new phase once this one has carried its share and the peer has acked it */
static void maybe_update_keys(wg_channel *ch) {
    if (ch->recovery.next_pn - ch->send_phase_first_pn < ch->key_update_packets) return;
    if (ch->recovery.largest_acked < (int64_t)ch->send_phase_first_pn) return;
    if (ch->recv_phase != ch->send_phase) return; /* the peer has not followed yet */
    next_send_phase(ch);
}

/* When the pacer lets the next packet go (< 0: now). Always now on a path whose round
 * trip is under WG_UNPACED_RTT_S (a machine room, loopback): the window (1.25 BDP, 64
 * packets at least) keeps what is in flight to about one short round trip, and pacing
 * finer than the event loop's timers would cost a wake-up per few packets at both
 * ends, about 1.5x the CPU per byte on loopback (bench/RESULTS.md). */
static double paced_until(wg_channel *ch, double now) {
    const wg_recovery *r = &ch->recovery;
    if (r->rtt_initialized && r->rtt_min < WG_UNPACED_RTT_S) return -1.0;
    return wg_pacer_next_send_time(&ch->recovery.pacer, now);
}

size_t wg_channel_flush(wg_channel *ch, double now) {
    size_t sent = 0;
    for (;;) {
        if (ch->recovery.next_pn >= ((uint64_t)1 << 62) - 1) break; /* never reuse a nonce */
        maybe_update_keys(ch);
        int owe_ack = wg_received_ack_due(&ch->received, now);
        if (ch->probes_due > 0) {
            /* probes go whatever the window says (RFC 9002 §7.5) */
            if (build_packet(ch, now, 1, 1, ch->queue_count > 0) < 0) break;
            ch->probes_due--;
            sent++;
            continue;
        }
        int may_send = ch->queue_count > 0 &&
                       wg_recovery_can_send(&ch->recovery, ch->max_packet_bytes) &&
                       paced_until(ch, now) < 0;
        if (may_send) {
            if (build_packet(ch, now, 1, 0, 1) < 0) break;
        } else if (owe_ack) {
            if (build_packet(ch, now, 1, 0, 0) < 0) break;
        } else {
            break;
        }
        sent++;
    }
    if (ch->batch_count > 0) send_batch(ch);
    return sent;
}

/* ----------------------------------------------------------- receiving */

static int is_mine(const wg_channel *ch, const uint8_t *data, size_t len) {
    return len >= WG_MIN_PACKET_LEN && len <= WG_MAX_PACKET_BYTES && (data[0] & 0xc0) == 0x40 &&
           memcmp(data + 1, ch->recv_cid, WG_CID_LEN) == 0;
}

int wg_channel_receive(wg_channel *ch, const uint8_t *data, size_t len, double now,
                       wg_parsed *parsed) {
    if (!is_mine(ch, data, len)) return WG_RECEIVE_NOT_MINE;
    memcpy(ch->scratch, data, len);
    return wg_channel_receive_in_place(ch, ch->scratch, len, now, parsed);
}

int wg_channel_receive_in_place(wg_channel *ch, uint8_t *buf, size_t len, double now,
                                wg_parsed *parsed) {
    if (!is_mine(ch, buf, len)) return WG_RECEIVE_NOT_MINE;
    int phase;
    uint64_t pn;
    if (wg_packet_unmask(&ch->recv_hp, buf, len, ch->received.largest, &phase, &pn) < 0) {
        ch->stats.not_opened++; /* reserved bits set: damaged or forged */
        return WG_RECEIVE_DROPPED;
    }
    if (!wg_received_is_new(&ch->received, pn)) {
        ch->stats.replayed++; /* before the AEAD: a replay costs a header check */
        return WG_RECEIVE_DROPPED;
    }
    long frames_len;
    int new_phase = 0;
    if (phase == ch->recv_phase) {
        frames_len = wg_packet_open(&ch->recv_cur, pn, buf, len);
    } else if (ch->has_prev && pn < ch->recv_phase_first_pn) {
        frames_len = wg_packet_open(&ch->recv_prev, pn, buf, len); /* reordered across an update */
    } else {
        frames_len = wg_packet_open(&ch->recv_next, pn, buf, len);
        new_phase = 1;
    }
    if (frames_len < 0) {
        ch->stats.not_opened++;
        return WG_RECEIVE_DROPPED;
    }
    if (new_phase) {
        if (next_recv_phase(ch, pn) < 0) return WG_RECEIVE_DROPPED;
        if (ch->send_phase != ch->recv_phase) next_send_phase(ch); /* §6.2: follow the peer */
    } else if (phase == ch->recv_phase && pn < ch->recv_phase_first_pn) {
        ch->recv_phase_first_pn = pn;
    }
    if (wg_frames_parse(buf + WG_SHORT_HEADER_LEN, (size_t)frames_len, parsed) < 0)
        return WG_RECEIVE_MALFORMED;
    wg_received_add(&ch->received, pn, parsed->ack_eliciting, now, WG_LOCAL_ACK_DELAY_S);
    ch->stats.packets_received++;
    ch->stats.bytes_received += len;
    if (parsed->has_ack) {
        double delay_s = (double)(parsed->ack.ack_delay << WG_ACK_DELAY_EXPONENT) / 1e6;
        wg_recovery_report report = {0};
        if (wg_recovery_on_ack(&ch->recovery, &parsed->ack, delay_s, now, &report) < 0)
            return WG_RECEIVE_BAD_ACK;
        ch->stats.acked_packets += report.acked_packets;
        ch->stats.lost_packets += report.lost_packets;
        ch->stats.lost_bytes += report.lost_bytes;
    }
    ch->stats.datagrams_received += parsed->datagram_count;
    return (int)parsed->datagram_count;
}

/* ---------------------------------------------------------------- timers */

double wg_channel_timer(wg_channel *ch, double now) {
    double at = wg_recovery_timer(&ch->recovery);
    if (ch->received.unacked_eliciting > 0 && ch->received.ack_at >= 0 &&
        (at < 0 || ch->received.ack_at < at))
        at = ch->received.ack_at;
    if (ch->queue_count > 0 &&
        wg_recovery_can_send(&ch->recovery, ch->max_packet_bytes)) {
        /* the pacer holds a packet back: wake up when it lets one go */
        double paced = paced_until(ch, now);
        if (paced >= 0 && (at < 0 || paced < at)) at = paced;
    }
    return at;
}

void wg_channel_on_timer(wg_channel *ch, double now) {
    double at = wg_recovery_timer(&ch->recovery);
    if (at >= 0 && at <= now) {
        wg_recovery_report report = {0};
        ch->probes_due += wg_recovery_on_timer(&ch->recovery, now, &report);
        ch->stats.lost_packets += report.lost_packets;
        ch->stats.lost_bytes += report.lost_bytes;
    }
}
