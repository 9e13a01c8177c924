/* The frames of a data-plane packet (wg_frames.h): varints, ACK, DATAGRAM, PING and
 * PADDING.  Every read checks what is left of the buffer first. */
#include "wg_frames.h"

#include <string.h>

size_t wg_varint_len(uint64_t v) {
    /* RFC 9000 §16: 6, 14, 30 or 62 bits of value after the 2-bit length */
    if (v < ((uint64_t)1 << 6)) return 1;
    if (v < ((uint64_t)1 << 14)) return 2;
    if (v < ((uint64_t)1 << 30)) return 4;
    if (v <= WG_VARINT_MAX) return 8;
    return 0;
}

size_t wg_varint_put(uint8_t *p, size_t cap, uint64_t v) {
    size_t n = wg_varint_len(v);
    if (n == 0 || n > cap || p == NULL) return 0;
    static const uint8_t prefix[9] = {0, 0x00, 0x40, 0, 0x80, 0, 0, 0, 0xc0};
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
    p[0] |= prefix[n];
    return n;
}

size_t wg_varint_get(const uint8_t *p, size_t len, uint64_t *v) {
    if (p == NULL || len == 0) return 0;
    size_t n = (size_t)1 << (p[0] >> 6);
    if (n > len) return 0;
    uint64_t x = p[0] & 0x3f;
    for (size_t i = 1; i < n; i++) x = (x << 8) | p[i];
    if (v != NULL) *v = x;
    return n;
}

/* The encoded ACK's fields (RFC 9000 §19.3), checked: ranges highest first, each
 * smallest <= largest, and at least one unacknowledged number between two ranges
 * (a gap field counts the numbers between them minus one, so it cannot be negative). */
static int ack_fields(const wg_ack *ack, uint64_t gaps[WG_MAX_ACK_RANGES],
                      uint64_t lens[WG_MAX_ACK_RANGES]) {
    if (ack->count == 0 || ack->count > WG_MAX_ACK_RANGES) return -1;
    if (ack->ack_delay > WG_VARINT_MAX) return -1;
    for (size_t i = 0; i < ack->count; i++) {
        const wg_ack_range *r = &ack->ranges[i];
        if (r->smallest > r->largest || r->largest > WG_VARINT_MAX) return -1;
        lens[i] = r->largest - r->smallest;
        gaps[i] = 0;
        if (i > 0) {
            const wg_ack_range *prev = &ack->ranges[i - 1];
            /* Gap = previous smallest - this largest - 2 (§19.3.1) */
            if (prev->smallest < 2 || r->largest > prev->smallest - 2) return -1;
            gaps[i] = prev->smallest - r->largest - 2;
        }
    }
    return 0;
}

size_t wg_ack_encode(const wg_ack *ack, uint8_t *p, size_t cap) {
    uint64_t gaps[WG_MAX_ACK_RANGES], lens[WG_MAX_ACK_RANGES];
    if (ack == NULL || p == NULL || ack_fields(ack, gaps, lens) < 0) return 0;
    /* how many ranges fit: the range count comes before them, so its own size depends
     * on the choice; the lowest ranges are the ones dropped (the peer has been told
     * about them in earlier ACKs, or will retransmit) */
    size_t fixed = 1 + wg_varint_len(ack->ranges[0].largest) + wg_varint_len(ack->ack_delay) +
                   wg_varint_len(lens[0]);
    size_t body = 0, best = 0, best_len = 0;
    for (size_t k = 1; k <= ack->count; k++) {
        if (k > 1) body += wg_varint_len(gaps[k - 1]) + wg_varint_len(lens[k - 1]);
        size_t total = fixed + wg_varint_len(k - 1) + body;
        if (total <= cap) {
            best = k;
            best_len = total;
        }
    }
    if (best == 0) return 0;
    size_t off = 0;
    p[off++] = WG_FRAME_ACK;
    off += wg_varint_put(p + off, cap - off, ack->ranges[0].largest);
    off += wg_varint_put(p + off, cap - off, ack->ack_delay);
    off += wg_varint_put(p + off, cap - off, best - 1); /* ACK Range Count */
    off += wg_varint_put(p + off, cap - off, lens[0]);  /* First ACK Range */
    for (size_t i = 1; i < best; i++) {
        off += wg_varint_put(p + off, cap - off, gaps[i]);
        off += wg_varint_put(p + off, cap - off, lens[i]);
    }
    return off == best_len ? off : 0;
}

/* RFC 9000 §19.3: an ACK frame after its type byte; returns the bytes consumed, or 0 */
static size_t ack_parse(const uint8_t *p, size_t len, wg_ack *ack) {
    size_t off = 0, n;
    uint64_t largest, delay, range_count, first;
    if ((n = wg_varint_get(p + off, len - off, &largest)) == 0) return 0;
    off += n;
    if ((n = wg_varint_get(p + off, len - off, &delay)) == 0) return 0;
    off += n;
    if ((n = wg_varint_get(p + off, len - off, &range_count)) == 0) return 0;
    off += n;
    if ((n = wg_varint_get(p + off, len - off, &first)) == 0) return 0;
    off += n;
    /* each further range is a gap and a length, one byte each at least: a count that
     * what is left cannot hold is rejected before any loop runs over it */
    if (range_count > (len - off) / 2) return 0;
    /* §19.3.1: smallest = largest - First ACK Range, which must not go below zero */
    if (first > largest) return 0;
    uint64_t smallest = largest - first;
    ack->ack_delay = delay;
    ack->ranges[0] = (wg_ack_range){smallest, largest};
    ack->count = 1;
    for (uint64_t i = 0; i < range_count; i++) {
        uint64_t gap, range_len;
        if ((n = wg_varint_get(p + off, len - off, &gap)) == 0) return 0;
        off += n;
        if ((n = wg_varint_get(p + off, len - off, &range_len)) == 0) return 0;
        off += n;
        /* §19.3.1: largest = previous smallest - gap - 2, smallest = largest - length;
         * neither may go below zero */
        if (smallest < 2 || gap > smallest - 2) return 0;
        largest = smallest - gap - 2;
        if (range_len > largest) return 0;
        smallest = largest - range_len;
        /* the lowest ranges beyond what is kept are checked but left off */
        if (ack->count < WG_MAX_ACK_RANGES)
            ack->ranges[ack->count++] = (wg_ack_range){smallest, largest};
    }
    return off;
}

int wg_frames_parse(const uint8_t *p, size_t len, wg_parsed *out) {
    if (out == NULL) return -1;
    out->ack_eliciting = 0;
    out->has_ack = 0;
    out->ack.count = 0;
    out->datagram_count = 0;
    /* RFC 9000 §12.4: a packet with no frames is a protocol violation */
    if (p == NULL || len == 0) return -1;
    size_t off = 0;
    while (off < len) {
        /* Frame types are varints, shortest encoding required (RFC 9000 §12.4); every
         * type known here is below 0x40, so it is one byte and any byte with the
         * length bits set is another type or a non-minimal encoding: an error. */
        uint8_t type = p[off++];
        switch (type) {
        case WG_FRAME_PADDING:
            /* RFC 9000 §19.1: no content; runs of them are common, skip them at once */
            while (off < len && p[off] == WG_FRAME_PADDING) off++;
            break;
        case WG_FRAME_PING:
            out->ack_eliciting = 1;
            break;
        case WG_FRAME_ACK: {
            if (out->has_ack) return -1; /* one ACK frame per packet here */
            size_t n = ack_parse(p + off, len - off, &out->ack);
            if (n == 0) return -1;
            off += n;
            out->has_ack = 1;
            break;
        }
        case WG_FRAME_DATAGRAM:
        case WG_FRAME_DATAGRAM_LEN: {
            /* RFC 9221 §4: 0x30 runs to the packet's end, 0x31 has a length first;
             * §5: DATAGRAM frames are ack-eliciting */
            uint64_t dlen = len - off;
            if (type == WG_FRAME_DATAGRAM_LEN) {
                size_t n = wg_varint_get(p + off, len - off, &dlen);
                if (n == 0) return -1;
                off += n;
                if (dlen > len - off) return -1;
            }
            size_t cap = sizeof out->datagram_off / sizeof out->datagram_off[0];
            if (out->datagram_count >= cap) return -1;
            out->datagram_off[out->datagram_count] = off;
            out->datagram_len[out->datagram_count] = (size_t)dlen;
            out->datagram_count++;
            off += (size_t)dlen;
            out->ack_eliciting = 1;
            break;
        }
        default:
            return -1;
        }
    }
    return 0;
}
