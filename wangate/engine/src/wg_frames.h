/* The QUIC frames a data-plane packet carries: PADDING (0x00), PING (0x01), ACK (0x02,
 * RFC 9000 §19.3, no ECN counts) and DATAGRAM (0x30 to the packet's end, 0x31 with a
 * length; RFC 9221 §4).  Every length is checked against what is left before use. */
#ifndef WG_FRAMES_H
#define WG_FRAMES_H

#include <stddef.h>
#include <stdint.h>

#define WG_FRAME_PADDING 0x00
#define WG_FRAME_PING 0x01
#define WG_FRAME_ACK 0x02
#define WG_FRAME_DATAGRAM 0x30
#define WG_FRAME_DATAGRAM_LEN 0x31

#define WG_MAX_ACK_RANGES 32 /* ranges kept and sent; older ones are dropped */
/* parenthesized whole (it was not), so that it can be used in any expression */
#define WG_VARINT_MAX (((uint64_t)1 << 62) - 1)

/* An ACK frame's content: ranges of packet numbers, highest first. */
typedef struct wg_ack_range {
    uint64_t smallest, largest; /* inclusive */
} wg_ack_range;

typedef struct wg_ack {
    uint64_t ack_delay; /* encoded (microseconds >> ack_delay_exponent) */
    size_t count;
    wg_ack_range ranges[WG_MAX_ACK_RANGES];
} wg_ack;

/* varints, RFC 9000 §16: the encoded size (1, 2, 4 or 8; 0 above WG_VARINT_MAX),
 * writing, reading */
size_t wg_varint_len(uint64_t v);
/* writes v at p if it fits in `cap`; returns bytes written, 0 if not */
size_t wg_varint_put(uint8_t *p, size_t cap, uint64_t v);
/* reads a varint at p[0..len); returns bytes consumed, 0 if truncated */
size_t wg_varint_get(const uint8_t *p, size_t len, uint64_t *v);

/* encode an ACK frame; returns its length or 0 if it does not fit `cap` (ranges that
 * do not fit are left off, lowest first, as long as one fits) */
size_t wg_ack_encode(const wg_ack *ack, uint8_t *p, size_t cap);

/* What one packet's frames hold, as parsed. */
typedef struct wg_parsed {
    int ack_eliciting;       /* any frame but ACK and PADDING */
    int has_ack;
    wg_ack ack;              /* when has_ack; more ranges than WG_MAX_ACK_RANGES: the
                                lowest are left off */
    size_t datagram_count;
    /* offsets and lengths into the frames buffer of each DATAGRAM frame's data */
    size_t datagram_off[16];
    size_t datagram_len[16];
} wg_parsed;

/* Parse a packet's frames.  0, or -1 for a malformed or unknown frame, an ACK frame
 * whose ranges go below zero, a second ACK frame, more than 16 DATAGRAM frames, or no
 * frames at all.  RFC 9000 §12.4: a packet with an unknown frame is an error, and so
 * is a packet with no frames. */
int wg_frames_parse(const uint8_t *p, size_t len, wg_parsed *out);

#endif
