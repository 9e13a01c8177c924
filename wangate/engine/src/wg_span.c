/* Framing a span of shards (wg_span.h); the layout is encode_shard's in
 * wangate/core/datagrams.py, held to it by tests/test_shard_spans.py. */
#include "wg_span.h"

#include <string.h>

#define DGRAM_SHARD 0x40
#define FLAG_CRITICAL 0x01
#define COMMON_BYTES 12 /* type u8, path_seq u32, stamp u24, msg_id u32 */
#define VARINT_MAX ((1ULL << 62) - 1)

/* bytes of `v` as a QUIC varint (RFC 9000 §16); v <= VARINT_MAX */
static size_t varint_bytes(uint64_t v) {
    return v < (1ULL << 6) ? 1 : v < (1ULL << 14) ? 2 : v < (1ULL << 30) ? 4 : 8;
}

static void put_varint(uint8_t *p, uint64_t v, size_t size) {
    uint64_t tagged = v | (uint64_t)(size == 1 ? 0 : size == 2 ? 1 : size == 4 ? 2 : 3)
                              << (8 * size - 2);
    for (size_t i = 0; i < size; i++) p[i] = (uint8_t)(tagged >> (8 * (size - 1 - i)));
}

static void put32(uint8_t *p, uint64_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* encode_shard's "usual" encoding: both varints 4 bytes whatever their values */
static int usual(const wg_span *s) {
    return s->msg_len >= (1ULL << 14) && s->msg_len < (1ULL << 30);
}

static size_t header_bytes(const wg_span *s) {
    return COMMON_BYTES + 2 * (usual(s) ? 4 : varint_bytes(s->msg_len));
}

int wg_span_check(const wg_span *s, size_t *count, size_t *longest, const char **why) {
    if (s->stride == 0 || s->start >= s->end) {
        *why = "a span needs a stride and at least one byte";
        return -1;
    }
    if (s->msg_len > VARINT_MAX || s->end > s->msg_len) {
        *why = "a span extends past the end of its message";
        return -1;
    }
    if (s->start < s->payload_base || s->end - s->payload_base > s->payload_len) {
        *why = "a span's bytes lie outside its payload";
        return -1;
    }
    if (s->stamp > 0xFFFFFF) {
        *why = "a span's stamp takes more than 24 bits";
        return -1;
    }
    uint64_t n = (s->end - s->start - 1) / s->stride + 1;
    if (n > WG_SPAN_MAX_DATAGRAMS || s->stride > 1u << 20) {
        *why = "a span of too many or too large datagrams";
        return -1;
    }
    if (s->seq_first + (n - 1) < s->seq_first) {
        *why = "a span's sequence numbers pass 2**64";
        return -1;
    }
    *count = (size_t)n;
    uint64_t first = s->end - s->start < s->stride ? s->end - s->start : s->stride;
    *longest = header_bytes(s) + (size_t)first;
    return 0;
}

size_t wg_span_write(const wg_span *s, size_t i, uint8_t *out) {
    uint64_t offset = s->start + (uint64_t)i * s->stride;
    uint64_t end = s->end - offset < s->stride ? s->end : offset + s->stride;
    uint64_t seq = s->seq_first + i;
    out[0] = (uint8_t)(DGRAM_SHARD | (s->critical ? FLAG_CRITICAL : 0));
    put32(out + 1, seq & 0xFFFFFFFFu);
    out[5] = (uint8_t)(s->stamp >> 16), out[6] = (uint8_t)(s->stamp >> 8);
    out[7] = (uint8_t)s->stamp;
    put32(out + 8, s->msg_id & 0xFFFFFFFFu);
    size_t size = usual(s) ? 4 : varint_bytes(s->msg_len);
    put_varint(out + COMMON_BYTES, s->msg_len, size);
    put_varint(out + COMMON_BYTES + size, offset, size);
    size_t head = COMMON_BYTES + 2 * size;
    memcpy(out + head, s->payload + (offset - s->payload_base), (size_t)(end - offset));
    return head + (size_t)(end - offset);
}
