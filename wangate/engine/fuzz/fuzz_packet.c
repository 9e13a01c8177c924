/* libFuzzer target: received short-header packets, as a channel takes them in, with
 * fixed keys: header protection removed (wg_packet_unmask, the packet number decoded
 * against the largest received), the replay window asked (wg_received_is_new), the
 * payload opened (wg_packet_open) and its frames parsed, the packet number recorded
 * (wg_received_add), and the ACK frame owed built, encoded and parsed back.
 *
 * Input: one knob byte, then packets, each a 2-byte big-endian header (low 15 bits: its
 * length; top bit: forget the ACK ranges up to this packet number afterwards, as when
 * an ACK of ours is acknowledged) and its bytes; the last may be cut short.  The knob:
 * bits 0-1 the suite (3: AES-128-GCM again), bits 2-6 the ack delay exponent (above
 * 20 is taken as 20), bit 7 records the packet number of a packet that does not open
 * too, so that the replay window sees packet numbers no forger could get past the AEAD.
 *
 * The keys (make_seeds.py seals its seeds with the same ones): AES-128-GCM the golden
 * vector's (proto/vectors/engine_short_packet_aes128gcm.hex), the others byte i of the
 * secret = (suite + 31 * i) mod 256. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "wg_frames.h"
#include "wg_keys.h"
#include "wg_packet.h"
#include "wg_received.h"

#define MAX_PACKETS 64
#define ACK_ROOM 600 /* more than the largest ACK frame (fuzz_frames.c) */

static const uint8_t GOLDEN_SECRET[32] = {
    0x3b, 0x12, 0x9e, 0xda, 0x03, 0xe9, 0xdb, 0xcc, 0x2c, 0x04, 0x16, 0x6c, 0x2d, 0xf4, 0x5b, 0x2d,
    0xf5, 0x8a, 0x72, 0xcb, 0x43, 0x6a, 0xca, 0xa5, 0x55, 0xe2, 0x78, 0x9e, 0x66, 0xd5, 0x67, 0xbf};
static const int SUITES[3] = {WG_TLS_AES_128_GCM_SHA256, WG_TLS_AES_256_GCM_SHA384,
                              WG_TLS_CHACHA20_POLY1305_SHA256};

static wg_aead aeads[3];
static wg_hp hps[3];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    for (int s = 0; s < 3; s++) {
        wg_secret secret = {SUITES[s], SUITES[s] == WG_TLS_AES_256_GCM_SHA384 ? 48 : 32, {0}};
        for (size_t i = 0; i < secret.len; i++)
            secret.bytes[i] = s == 0 ? GOLDEN_SECRET[i] : (uint8_t)(SUITES[s] + 31 * i);
        CHECK(wg_aead_init(&aeads[s], &secret, 0) == 0);
        CHECK(wg_hp_init(&hps[s], &secret) == 0);
    }
    return 0;
}

static void check_ranges(const wg_received *r) {
    CHECK(r->range_count <= WG_MAX_ACK_RANGES);
    for (size_t i = 0; i < r->range_count; i++) {
        CHECK(r->ranges[i].smallest <= r->ranges[i].largest);
        CHECK(r->largest >= 0 && r->ranges[i].largest <= (uint64_t)r->largest);
        /* highest first, never adjacent */
        if (i > 0) CHECK(r->ranges[i].largest + 1 < r->ranges[i - 1].smallest);
    }
}

/* the ACK owed: what wg_received_ack says, encoded and parsed back unchanged */
static void check_ack(const wg_received *r, double now, unsigned exponent) {
    wg_ack ack;
    if (!wg_received_ack(r, &ack, now, exponent)) {
        CHECK(r->range_count == 0);
        return;
    }
    CHECK(ack.count == r->range_count);
    uint8_t frame[ACK_ROOM];
    size_t n = wg_ack_encode(&ack, frame, sizeof frame);
    CHECK(n > 0);
    wg_parsed back;
    CHECK(wg_frames_parse(frame, n, &back) == 0 && back.has_ack);
    CHECK(back.ack.count == ack.count && back.ack.ack_delay == ack.ack_delay);
    for (size_t i = 0; i < ack.count; i++)
        CHECK(back.ack.ranges[i].smallest == ack.ranges[i].smallest &&
              back.ack.ranges[i].largest == ack.ranges[i].largest);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t knob = data[0];
    int s = (knob & 3) == 3 ? 0 : knob & 3;
    unsigned exponent = (knob >> 2) & 0x1f;
    int record_unopened = knob >> 7;
    size_t off = 1;
    wg_received r;
    wg_received_init(&r);
    double now = 1.0;
    static uint8_t buf[1 << 15];
    for (int count = 0; count < MAX_PACKETS && size - off >= 2; count++) {
        unsigned head = (unsigned)data[off] << 8 | data[off + 1];
        off += 2;
        size_t len = head & 0x7fff;
        if (len > size - off) len = size - off;
        memcpy(buf, data + off, len);
        off += len;
        now += 0.001;

        int key_phase = -1;
        uint64_t pn = 0;
        if (wg_packet_unmask(&hps[s], buf, len, r.largest, &key_phase, &pn) != 0) continue;
        CHECK(len >= WG_MIN_PACKET_LEN && (key_phase == 0 || key_phase == 1));
        CHECK((buf[0] & 0xdb) == 0x43); /* short, fixed bit, reserved 0, PN length 4 */
        int is_new = wg_received_is_new(&r, pn);
        long frames_len = wg_packet_open(&aeads[s], pn, buf, len);
        int eliciting = 0;
        if (frames_len >= 0) {
            CHECK((size_t)frames_len == len - WG_PACKET_OVERHEAD);
            wg_parsed parsed;
            if (wg_frames_parse(buf + WG_SHORT_HEADER_LEN, (size_t)frames_len, &parsed) == 0)
                eliciting = parsed.ack_eliciting;
        } else if (!record_unopened) {
            continue;
        }
        uint64_t duplicates = r.duplicates, too_old = r.too_old;
        int added = wg_received_add(&r, pn, eliciting, now, 0.025);
        CHECK(added == is_new);
        CHECK(!wg_received_is_new(&r, pn));
        if (added) {
            CHECK(r.largest >= 0 && pn <= (uint64_t)r.largest);
        } else {
            CHECK(r.duplicates + r.too_old == duplicates + too_old + 1);
        }
        check_ranges(&r);
        if (head & 0x8000) {
            wg_received_forget(&r, pn);
            check_ranges(&r);
            for (size_t i = 0; i < r.range_count; i++) CHECK(r.ranges[i].smallest > pn);
        }
        if (wg_received_ack_due(&r, now)) {
            check_ack(&r, now, exponent);
            wg_received_ack_sent(&r);
            CHECK(!wg_received_ack_due(&r, now));
        }
    }
    check_ack(&r, now + 1.0, exponent);
    return 0;
}
