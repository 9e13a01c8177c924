/* QUIC version 1 short-header (1-RTT) packets of a data-plane channel.
 *
 * Layout (RFC 9000 §17.3.1): first byte 0b01SRRKPP (fixed bit set, spin 0, reserved 0
 * after protection is removed, K the key phase, PP the packet number length - 1), the
 * receiver's connection ID (WG_CID_LEN bytes), the packet number (always 4 bytes
 * here), then the AEAD-sealed frames.  Header protection per RFC 9001 §5.4: the sample
 * starts 4 bytes after the packet number's first byte.
 */
#ifndef WG_PACKET_H
#define WG_PACKET_H

#include <stddef.h>
#include <stdint.h>

#include "wg_keys.h"

#define WG_CID_LEN 8
#define WG_PN_LEN 4
#define WG_SHORT_HEADER_LEN (1 + WG_CID_LEN + WG_PN_LEN)
/* header + tag: what a packet adds to its frames */
#define WG_PACKET_OVERHEAD (WG_SHORT_HEADER_LEN + WG_TAG_LEN)
/* the smallest packet header protection can sample: 4 bytes of PN + 16 of sample */
#define WG_MIN_PACKET_LEN (1 + WG_CID_LEN + 4 + WG_HP_SAMPLE_LEN)

/* Write the unprotected header for `pn` at `buf` (WG_SHORT_HEADER_LEN bytes). */
void wg_short_header(uint8_t *buf, const uint8_t cid[WG_CID_LEN], int key_phase, uint64_t pn);

/* Seal a packet whose header (wg_short_header) and `frames_len` bytes of frames are at
 * `buf`, then apply header protection.  Returns the packet's length, or -1. */
long wg_packet_seal(wg_aead *aead, wg_hp *hp, uint64_t pn, uint8_t *buf, size_t frames_len,
                    size_t cap);

/* Apply header protection (RFC 9001 §5.4.1) to any protected QUIC v1 packet at `buf`
 * (`len` bytes, its payload already sealed) whose packet number starts at `pn_offset`;
 * its length is the first byte's PP bits + 1.  Long headers (form bit set) mask 4 bits
 * of the first byte, short ones 5.  0, or -1 when the sample would lie past `len`.
 * wg_packet_seal uses it; it also lets the RFC 9001 Appendix A long-header vectors be
 * checked against this code. */
int wg_header_protect(wg_hp *hp, uint8_t *buf, size_t len, size_t pn_offset);

/* Remove header protection in place from the packet at `buf` (`len` bytes, DCID
 * already matched by the caller).  On success sets *key_phase and *pn (decoded
 * against `largest_pn`, RFC 9000 §A.3, -1 when none yet) and returns 0; -1 if the
 * packet is too short or its reserved bits are not zero. */
int wg_packet_unmask(wg_hp *hp, uint8_t *buf, size_t len, int64_t largest_pn, int *key_phase,
                     uint64_t *pn);

/* Open the payload of an unmasked packet; returns the frames' length (they start at
 * buf + WG_SHORT_HEADER_LEN) or -1. */
long wg_packet_open(wg_aead *aead, uint64_t pn, uint8_t *buf, size_t len);

/* A data-plane direction's secret and the connection ID its receiver gets packets on,
 * from that direction's TLS 1.3 application traffic secret 0 (proto/engine.md):
 *     dp_secret = HKDF-Expand-Label(traffic_secret, "wangate dp", "", Hash.length)
 *     cid       = HKDF-Expand-Label(dp_secret, "wangate cid", "", 8)
 * `traffic_len` must be the suite's hash length.  0, or -1. */
int wg_data_plane_derive(int suite, const uint8_t *traffic_secret, size_t traffic_len,
                         wg_secret *dp_secret, uint8_t cid[WG_CID_LEN]);

/* RFC 9000 §A.3 */
uint64_t wg_decode_pn(int64_t largest_pn, uint64_t truncated, unsigned pn_nbits);

#endif
