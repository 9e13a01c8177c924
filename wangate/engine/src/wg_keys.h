/* Keys of one direction of a data-plane channel, from a TLS 1.3 traffic secret.
 *
 * RFC 9001 §5.1: key, iv and hp come from the secret by HKDF-Expand-Label with the
 * labels "quic key", "quic iv" and "quic hp"; §6.1: the next generation's secret by
 * "quic ku" (the hp key is not updated).  The AEAD and header-protection contexts are
 * set up once here, so that protecting a packet only sets its nonce.
 */
#ifndef WG_KEYS_H
#define WG_KEYS_H

#include <stddef.h>
#include <stdint.h>

/* TLS 1.3 cipher suites (RFC 8446 §B.4) */
#define WG_TLS_AES_128_GCM_SHA256 0x1301
#define WG_TLS_AES_256_GCM_SHA384 0x1302
#define WG_TLS_CHACHA20_POLY1305_SHA256 0x1303

#define WG_MAX_SECRET 48
#define WG_MAX_KEY 32
#define WG_IV_LEN 12
#define WG_TAG_LEN 16
#define WG_HP_SAMPLE_LEN 16

typedef struct evp_cipher_ctx_st wg_cipher_ctx; /* EVP_CIPHER_CTX */

typedef struct wg_aead {
    wg_cipher_ctx *ctx; /* key set; only the nonce changes per packet */
    uint8_t iv[WG_IV_LEN];
    int encrypt;
} wg_aead;

typedef struct wg_hp {
    int suite;
    wg_cipher_ctx *ctx; /* AES-ECB with the hp key, or ChaCha20 (key set per mask) */
    uint8_t key[WG_MAX_KEY];
} wg_hp;

typedef struct wg_secret {
    int suite;
    size_t len; /* the suite's hash length: 32 or 48 */
    uint8_t bytes[WG_MAX_SECRET];
} wg_secret;

/* 0, or -1 for an unknown suite or a libcrypto failure */
int wg_suite_sizes(int suite, size_t *secret_len, size_t *key_len);
int wg_hkdf_expand_label(int suite, const uint8_t *secret, size_t secret_len, const char *label,
                         const uint8_t *context, size_t context_len, uint8_t *out, size_t out_len);

/* key and iv from `secret` into a ready AEAD context; `encrypt` 1 to seal, 0 to open */
int wg_aead_init(wg_aead *aead, const wg_secret *secret, int encrypt);
void wg_aead_free(wg_aead *aead);
int wg_hp_init(wg_hp *hp, const wg_secret *secret);
void wg_hp_free(wg_hp *hp);
/* "quic ku": the secret of the next key phase */
int wg_secret_next(const wg_secret *current, wg_secret *next);

/* Seal in place: `plain_len` bytes at `buf + header_len` become ciphertext followed by
 * the 16-byte tag, the `header_len` bytes before them the associated data.  The nonce
 * is iv XOR the packet number (RFC 9001 §5.3).  `cap` is the room at `buf`.  Returns
 * the sealed packet's length, or -1. */
long wg_aead_seal(wg_aead *aead, uint64_t pn, uint8_t *buf, size_t header_len, size_t plain_len,
                  size_t cap);
/* Open in place; `sealed_len` counts the tag.  Returns the plaintext's length, or -1
 * when the tag does not verify (forged, damaged, or another key). */
long wg_aead_open(wg_aead *aead, uint64_t pn, uint8_t *buf, size_t header_len, size_t sealed_len);

/* The 5-byte header-protection mask from a 16-byte sample (RFC 9001 §5.4.3, §5.4.4) */
int wg_hp_mask(wg_hp *hp, const uint8_t *sample, uint8_t mask[5]);

#endif
