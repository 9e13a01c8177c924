/* A span of shards to send: consecutive pieces of one message, cut and framed here
 * exactly as the session's encode_shard frames one (proto/wire.md, "Datagrams").
 *
 * Datagram i of a span carries the message's bytes [start + i * stride,
 * min(start + (i + 1) * stride, end)) with path sequence number seq_first + i; every one
 * has the span's send stamp.  The bytes come from `payload`, which holds the message
 * from offset `payload_base` on (the part after its encoded header).
 */
#ifndef WG_SPAN_H
#define WG_SPAN_H

#include <stddef.h>
#include <stdint.h>

typedef struct wg_span {
    const uint8_t *payload;
    size_t payload_len;
    uint64_t payload_base;
    uint64_t seq_first;
    uint64_t stamp; /* 24 bits (wg_span_check) */
    uint64_t msg_id, msg_len, start, end, stride;
    int critical;
} wg_span;

#define WG_SPAN_MAX_DATAGRAMS 4096 /* one span: far more than a send batch */

/* The span's datagram count and the bytes of its longest datagram, or -1 with *why
 * set to a static message when its fields do not describe shards of one message. */
int wg_span_check(const wg_span *s, size_t *count, size_t *longest, const char **why);

/* Datagram `i` of a checked span written at `out` (room for its longest); its length. */
size_t wg_span_write(const wg_span *s, size_t i, uint8_t *out);

#endif
