/* QUIC version 1 short-header packets of a data-plane channel (wg_packet.h). */
#include "wg_packet.h"

#include <string.h>

/* offset of the packet number in a short header: first byte, then the DCID */
#define PN_OFFSET (1 + WG_CID_LEN)

void wg_short_header(uint8_t *buf, const uint8_t cid[WG_CID_LEN], int key_phase, uint64_t pn) {
    /* RFC 9000 §17.3.1: 0b01SRRKPP with spin 0, reserved 0, PP = 4 - 1 */
    buf[0] = (uint8_t)(0x40 | (key_phase ? 0x04 : 0x00) | (WG_PN_LEN - 1));
    memcpy(buf + 1, cid, WG_CID_LEN);
    /* the low 32 bits, big-endian (RFC 9000 §17.1) */
    for (int i = 0; i < WG_PN_LEN; i++)
        buf[PN_OFFSET + i] = (uint8_t)(pn >> (8 * (WG_PN_LEN - 1 - i)));
}

int wg_header_protect(wg_hp *hp, uint8_t *buf, size_t len, size_t pn_offset) {
    if (buf == NULL || len == 0) return -1;
    size_t pn_len = (size_t)(buf[0] & 0x03) + 1;
    /* RFC 9001 §5.4.2: the sample starts 4 bytes after the packet number's start,
     * whatever its length; the packet number itself must be inside the packet */
    if (pn_offset < 1 || pn_offset > len || len - pn_offset < 4 + WG_HP_SAMPLE_LEN) return -1;
    uint8_t mask[5];
    if (wg_hp_mask(hp, buf + pn_offset + 4, mask) < 0) return -1;
    /* RFC 9001 §5.4.1: 4 bits of a long header's first byte, 5 of a short one's; the
     * packet number length is read before the first byte is masked */
    buf[0] ^= mask[0] & ((buf[0] & 0x80) ? 0x0f : 0x1f);
    for (size_t i = 0; i < pn_len; i++) buf[pn_offset + i] ^= mask[1 + i];
    return 0;
}

long wg_packet_seal(wg_aead *aead, wg_hp *hp, uint64_t pn, uint8_t *buf, size_t frames_len,
                    size_t cap) {
    if (buf == NULL) return -1;
    long sealed = wg_aead_seal(aead, pn, buf, WG_SHORT_HEADER_LEN, frames_len, cap);
    if (sealed < 0) return -1;
    /* at least 16 bytes of tag follow the 4-byte packet number: always sampleable */
    if (wg_header_protect(hp, buf, (size_t)sealed, PN_OFFSET) < 0) return -1;
    return sealed;
}

int wg_packet_unmask(wg_hp *hp, uint8_t *buf, size_t len, int64_t largest_pn, int *key_phase,
                     uint64_t *pn) {
    if (buf == NULL || key_phase == NULL || pn == NULL) return -1;
    if (len < WG_MIN_PACKET_LEN) return -1;
    /* RFC 9000 §17.3.1: header form 0 (short); the form bit is not protected */
    if (buf[0] & 0x80) return -1;
    uint8_t mask[5];
    /* RFC 9001 §5.4.2: sampled as if the packet number were 4 bytes long */
    if (wg_hp_mask(hp, buf + PN_OFFSET + 4, mask) < 0) return -1;
    uint8_t first = buf[0] ^ (mask[0] & 0x1f);
    /* fixed bit 1 (RFC 9000 §17.3.1), reserved bits 0 (ibid.: a non-zero value is a
     * PROTOCOL_VIOLATION; such a packet is dropped here), PN length 4: the only one
     * sent on a data-plane channel */
    if (!(first & 0x40) || (first & 0x18) != 0) return -1;
    unsigned pn_len = (unsigned)(first & 0x03) + 1;
    if (pn_len != WG_PN_LEN) return -1;
    buf[0] = first;
    uint64_t truncated = 0;
    for (unsigned i = 0; i < pn_len; i++) {
        buf[PN_OFFSET + i] ^= mask[1 + i];
        truncated = (truncated << 8) | buf[PN_OFFSET + i];
    }
    *key_phase = (first >> 2) & 1;
    *pn = wg_decode_pn(largest_pn, truncated, 8 * pn_len);
    return 0;
}

long wg_packet_open(wg_aead *aead, uint64_t pn, uint8_t *buf, size_t len) {
    if (buf == NULL || len < WG_SHORT_HEADER_LEN + WG_TAG_LEN) return -1;
    return wg_aead_open(aead, pn, buf, WG_SHORT_HEADER_LEN, len - WG_SHORT_HEADER_LEN);
}

int wg_data_plane_derive(int suite, const uint8_t *traffic_secret, size_t traffic_len,
                         wg_secret *dp_secret, uint8_t cid[WG_CID_LEN]) {
    size_t hash_len = 0;
    if (dp_secret == NULL || cid == NULL || wg_suite_sizes(suite, &hash_len, NULL) < 0) return -1;
    if (traffic_secret == NULL || traffic_len != hash_len) return -1;
    /* a secret of its own, so that the data plane's keys are never the ones aioquic
     * protects the control connection's packets with (those come from the traffic
     * secret itself by "quic key", RFC 9001 §5.1) */
    dp_secret->suite = suite;
    dp_secret->len = hash_len;
    if (wg_hkdf_expand_label(suite, traffic_secret, traffic_len, "wangate dp", NULL, 0,
                             dp_secret->bytes, hash_len) < 0)
        return -1;
    return wg_hkdf_expand_label(suite, dp_secret->bytes, hash_len, "wangate cid", NULL, 0, cid,
                                WG_CID_LEN);
}

/* RFC 9000 §A.3: the packet number closest to largest_pn + 1 whose low pn_nbits
 * bits are `truncated`.  Signed arithmetic of the RFC's pseudocode is done unsigned
 * with explicit guards so nothing wraps; pn_nbits other than 8, 16, 24 or 32 (no
 * packet number length gives them) return `truncated` unchanged. */
uint64_t wg_decode_pn(int64_t largest_pn, uint64_t truncated, unsigned pn_nbits) {
    if (pn_nbits == 0 || pn_nbits > 32 || pn_nbits % 8 != 0) return truncated;
    const uint64_t limit = (uint64_t)1 << 62;
    uint64_t expected = largest_pn < 0 ? 0 : (uint64_t)largest_pn + 1;
    uint64_t win = (uint64_t)1 << pn_nbits;
    uint64_t hwin = win / 2;
    uint64_t mask = win - 1;
    truncated &= mask;
    uint64_t candidate = (expected & ~mask) | truncated;
    if (expected >= hwin && candidate <= expected - hwin && candidate < limit - win)
        return candidate + win;
    if (candidate > expected + hwin && candidate >= win) return candidate - win;
    return candidate;
}
