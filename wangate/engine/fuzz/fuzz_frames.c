/* libFuzzer target: a packet's frames (wg_frames_parse), a varint at the input's start
 * (wg_varint_get), and the ACK frame that parsed, encoded again (wg_ack_encode).
 *
 * Contract checked, beyond what ASan and UBSan see: every DATAGRAM lies inside the
 * input; a parsed ACK's ranges go highest first with a gap between them; it encodes,
 * whole when there is room and its highest ranges when there is less, to a frame that
 * parses back to the same ranges and delay; a varint re-encodes to its value in its
 * shortest form.  A broken contract aborts, which libFuzzer reports as a crash. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "wg_frames.h"

/* ACK_MAX: the largest ACK frame, 32 ranges of 8-byte varints (1 + 4 * 8 + 31 * 16) */
#define ACK_MAX (1 + 4 * 8 + (WG_MAX_ACK_RANGES - 1) * 16)

static void check_varint(const uint8_t *data, size_t size) {
    uint64_t v = 0;
    size_t n = wg_varint_get(data, size, &v);
    if (size == 0) {
        CHECK(n == 0);
        return;
    }
    size_t want = (size_t)1 << (data[0] >> 6);
    if (want > size) {
        CHECK(n == 0);
        return;
    }
    CHECK(n == want && v <= WG_VARINT_MAX);
    uint8_t out[8];
    size_t m = wg_varint_put(out, sizeof out, v);
    CHECK(m == wg_varint_len(v) && m >= 1 && m <= n);
    uint64_t back = 0;
    CHECK(wg_varint_get(out, m, &back) == m && back == v);
    if (m == n) CHECK(memcmp(out, data, n) == 0);
    CHECK(wg_varint_put(out, m - 1, v) == 0); /* one byte short: nothing written */
}

static void check_ack(const wg_ack *ack) {
    CHECK(ack->count >= 1 && ack->count <= WG_MAX_ACK_RANGES);
    CHECK(ack->ack_delay <= WG_VARINT_MAX);
    for (size_t i = 0; i < ack->count; i++) {
        CHECK(ack->ranges[i].smallest <= ack->ranges[i].largest);
        CHECK(ack->ranges[i].largest <= WG_VARINT_MAX);
        if (i > 0) CHECK(ack->ranges[i].largest + 2 <= ack->ranges[i - 1].smallest);
    }
}

/* encode into `cap` bytes; when it fits, the frame parses back to the highest ranges */
static void round_trip(const wg_ack *ack, size_t cap, int must_fit) {
    uint8_t buf[ACK_MAX];
    if (cap > sizeof buf) cap = sizeof buf;
    size_t n = wg_ack_encode(ack, buf, cap);
    if (must_fit) CHECK(n > 0);
    if (n == 0) return;
    CHECK(n <= cap);
    wg_parsed back;
    CHECK(wg_frames_parse(buf, n, &back) == 0);
    CHECK(back.has_ack && !back.ack_eliciting && back.datagram_count == 0);
    CHECK(back.ack.ack_delay == ack->ack_delay);
    CHECK(back.ack.count >= 1 && back.ack.count <= ack->count);
    if (must_fit) CHECK(back.ack.count == ack->count);
    for (size_t i = 0; i < back.ack.count; i++) {
        CHECK(back.ack.ranges[i].smallest == ack->ranges[i].smallest);
        CHECK(back.ack.ranges[i].largest == ack->ranges[i].largest);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_varint(data, size);
    wg_parsed parsed;
    if (wg_frames_parse(data, size, &parsed) != 0) return 0;
    CHECK(size > 0);
    CHECK(parsed.datagram_count <= 16);
    for (size_t i = 0; i < parsed.datagram_count; i++) {
        CHECK(parsed.datagram_off[i] >= 1 && parsed.datagram_off[i] <= size);
        CHECK(parsed.datagram_len[i] <= size - parsed.datagram_off[i]);
        if (i > 0) CHECK(parsed.datagram_off[i] > parsed.datagram_off[i - 1]);
    }
    if (parsed.datagram_count > 0) CHECK(parsed.ack_eliciting);
    if (!parsed.has_ack) return 0;
    check_ack(&parsed.ack);
    round_trip(&parsed.ack, ACK_MAX, 1);
    /* less room: the input's last byte picks how much */
    round_trip(&parsed.ack, data[size - 1] % ACK_MAX, 0);
    return 0;
}
