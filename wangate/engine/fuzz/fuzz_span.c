/* libFuzzer target: a span of shards (wg_span_check, wg_span_write). Its fields are the
 * input's first 69 bytes: 8 u64s big-endian (payload_base, seq_first, msg_id, msg_len,
 * start, end, stride, one unused), the stamp as a u32, a flags byte (bit 0 critical, bit 1
 * folds the fields into a valid span's ranges); its payload is the rest of the input.
 *
 * Contract checked, beyond what ASan and UBSan see: a checked span's datagrams each fit
 * in the longest it reported (written into a buffer of exactly that size); each
 * parses back to its fields: type and flags, the low 32 bits of seq_first + i and of
 * msg_id, the stamp, msg_len and its offset as varints of one size (4 bytes when
 * msg_len is 2^14 .. 2^30), then exactly the payload's bytes for it; together they
 * carry [start, end) once; a span refused names why. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "wg_span.h"

#define HEAD_BYTES (8 * 8 + 4 + 1)

static uint64_t be(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* a varint at p of `size` bytes (its tag checked): its value */
static uint64_t varint(const uint8_t *p, size_t size) {
    CHECK((size_t)1 << (p[0] >> 6) == size);
    return be(p, size) & (((uint64_t)1 << (8 * size - 2)) - 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < HEAD_BYTES) return 0;
    uint64_t f[8];
    for (int i = 0; i < 8; i++) f[i] = be(data + 8 * i, 8);
    uint32_t stamp = (uint32_t)be(data + 64, 4);
    uint8_t flags = data[68];
    const uint8_t *payload = data + HEAD_BYTES;
    size_t payload_len = size - HEAD_BYTES;
    wg_span s = {payload, payload_len, f[0], f[1], stamp, f[2], f[3], f[4], f[5], f[6],
                 flags & 1};
    if (flags & 2) { /* folded: mostly valid */
        s.msg_len = f[3] % ((uint64_t)1 << 62);
        if (s.msg_len == 0) s.msg_len = 1;
        s.payload_base %= s.msg_len;
        uint64_t room = s.msg_len - s.payload_base;
        if (room > payload_len) room = payload_len;
        if (room == 0) room = 1;
        s.start = s.payload_base + f[4] % room;
        s.end = s.start + 1 + f[5] % (room - (s.start - s.payload_base)); /* <= base + room */
        s.stride = 1 + f[6] % 3000;
        s.stamp &= 0xFFFFFF;
    }
    size_t count = 0, longest = 0;
    const char *why = NULL;
    if (wg_span_check(&s, &count, &longest, &why) < 0) {
        CHECK(why != NULL && why[0] != '\0');
        return 0;
    }
    CHECK(count >= 1 && count <= WG_SPAN_MAX_DATAGRAMS);
    CHECK(s.end <= s.msg_len && s.start >= s.payload_base && s.stamp <= 0xFFFFFF);
    size_t vsize = s.msg_len >= (1u << 14) && s.msg_len < (1u << 30) ? 4
                   : s.msg_len < (1u << 6)                          ? 1
                   : s.msg_len < (1u << 14)                         ? 2
                   : s.msg_len < (1u << 30)                         ? 4
                                                                    : 8;
    uint8_t *out = malloc(longest); /* exactly: ASan sees a byte beyond */
    CHECK(out != NULL);
    uint64_t carried = s.start;
    for (size_t i = 0; i < count; i++) {
        size_t len = wg_span_write(&s, i, out);
        CHECK(len <= longest && len > 12 + 2 * vsize);
        CHECK(out[0] == (0x40 | (s.critical ? 1 : 0)));
        CHECK(be(out + 1, 4) == ((s.seq_first + i) & 0xFFFFFFFFu));
        CHECK(be(out + 5, 3) == s.stamp);
        CHECK(be(out + 8, 4) == (s.msg_id & 0xFFFFFFFFu));
        CHECK(varint(out + 12, vsize) == s.msg_len);
        uint64_t offset = varint(out + 12 + vsize, vsize);
        CHECK(offset == carried);
        size_t n = len - 12 - 2 * vsize;
        CHECK(offset + n <= s.end && (n == s.stride || offset + n == s.end));
        CHECK(memcmp(out + 12 + 2 * vsize, payload + (offset - s.payload_base), n) == 0);
        carried += n;
    }
    CHECK(carried == s.end);
    free(out);
    return 0;
}
