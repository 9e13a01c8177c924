/* Keys of one direction of a data-plane channel (wg_keys.h): HKDF-Expand-Label, the
 * packet AEADs and header protection, all with OpenSSL's EVP interface.
 *
 * Every EVP context is made in *_init, so sealing or opening a packet only sets the
 * nonce on a context whose key is already scheduled: no allocation per packet. */
#include "wg_keys.h"

#include <limits.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

/* The hash, AEAD and header-protection cipher of each suite (RFC 8446 §B.4; RFC 9001
 * §5.3 for the AEADs, §5.4.3 and §5.4.4 for header protection). */
typedef struct suite_info {
    size_t secret_len; /* the hash's output length */
    size_t key_len;
    const EVP_MD *(*md)(void);
    const EVP_CIPHER *(*aead)(void);
    const EVP_CIPHER *(*hp)(void);
} suite_info;

static int suite_lookup(int suite, suite_info *info) {
    switch (suite) {
    case WG_TLS_AES_128_GCM_SHA256:
        *info = (suite_info){32, 16, EVP_sha256, EVP_aes_128_gcm, EVP_aes_128_ecb};
        return 0;
    case WG_TLS_AES_256_GCM_SHA384:
        *info = (suite_info){48, 32, EVP_sha384, EVP_aes_256_gcm, EVP_aes_256_ecb};
        return 0;
    case WG_TLS_CHACHA20_POLY1305_SHA256:
        *info = (suite_info){32, 32, EVP_sha256, EVP_chacha20_poly1305, EVP_chacha20};
        return 0;
    default:
        return -1;
    }
}

int wg_suite_sizes(int suite, size_t *secret_len, size_t *key_len) {
    suite_info info;
    if (suite_lookup(suite, &info) < 0) return -1;
    if (secret_len != NULL) *secret_len = info.secret_len;
    if (key_len != NULL) *key_len = info.key_len;
    return 0;
}

/* The "tls13 " prefix of every TLS 1.3 label (RFC 8446 §7.1) */
#define LABEL_PREFIX "tls13 "
#define LABEL_PREFIX_LEN 6

/* HKDF-Expand-Label (RFC 8446 §7.1) over HKDF-Expand (RFC 5869 §2.3):
 *
 *     struct { uint16 length; opaque label<7..255> = "tls13 " + Label;
 *              opaque context<0..255>; } HkdfLabel;
 *     T(i) = HMAC(secret, T(i-1) | HkdfLabel | i),  out = first out_len bytes of T(1)...
 *
 * The one-shot HMAC() is used so that no context has to be kept or freed. */
int wg_hkdf_expand_label(int suite, const uint8_t *secret, size_t secret_len, const char *label,
                         const uint8_t *context, size_t context_len, uint8_t *out, size_t out_len) {
    suite_info info;
    if (suite_lookup(suite, &info) < 0 || secret == NULL || label == NULL || out == NULL) return -1;
    size_t label_len = strlen(label);
    /* label<7..255> with the prefix; context<0..255>; RFC 5869: L <= 255 * HashLen */
    if (label_len == 0 || label_len > 255 - LABEL_PREFIX_LEN) return -1;
    if (context_len > 255 || (context_len > 0 && context == NULL)) return -1;
    if (out_len == 0 || out_len > 0xffff || out_len > 255 * info.secret_len) return -1;
    if (secret_len == 0 || secret_len > INT_MAX) return -1;

    /* T(i-1) (at most EVP_MAX_MD_SIZE) | HkdfLabel (at most 2 + 1 + 255 + 1 + 255) | i */
    uint8_t block[EVP_MAX_MD_SIZE + 514 + 1];
    size_t info_len = 0;
    uint8_t *hl = block + EVP_MAX_MD_SIZE;
    hl[info_len++] = (uint8_t)(out_len >> 8);
    hl[info_len++] = (uint8_t)out_len;
    hl[info_len++] = (uint8_t)(LABEL_PREFIX_LEN + label_len);
    memcpy(hl + info_len, LABEL_PREFIX, LABEL_PREFIX_LEN);
    info_len += LABEL_PREFIX_LEN;
    memcpy(hl + info_len, label, label_len);
    info_len += label_len;
    hl[info_len++] = (uint8_t)context_len;
    if (context_len > 0) memcpy(hl + info_len, context, context_len);
    info_len += context_len;

    const EVP_MD *md = info.md();
    size_t hash_len = info.secret_len;
    uint8_t t[EVP_MAX_MD_SIZE];
    size_t done = 0;
    int rc = 0;
    for (unsigned i = 1; done < out_len; i++) {
        /* T(1) has no T(0) before the info; later blocks start with the previous T */
        uint8_t *start = hl;
        size_t in_len = info_len + 1;
        if (i > 1) {
            start = hl - hash_len;
            memcpy(start, t, hash_len);
            in_len += hash_len;
        }
        hl[info_len] = (uint8_t)i;
        unsigned int t_len = 0;
        if (HMAC(md, secret, (int)secret_len, start, in_len, t, &t_len) == NULL ||
            t_len != hash_len) {
            rc = -1;
            break;
        }
        size_t n = out_len - done < hash_len ? out_len - done : hash_len;
        memcpy(out + done, t, n);
        done += n;
    }
    OPENSSL_cleanse(t, sizeof t);
    OPENSSL_cleanse(block, sizeof block);
    if (rc < 0) OPENSSL_cleanse(out, out_len);
    return rc;
}

/* the suite of `secret`, checked: its length must be the suite's hash length */
static int secret_check(const wg_secret *secret, suite_info *info) {
    if (secret == NULL || suite_lookup(secret->suite, info) < 0) return -1;
    return secret->len == info->secret_len ? 0 : -1;
}

int wg_aead_init(wg_aead *aead, const wg_secret *secret, int encrypt) {
    suite_info info;
    if (aead == NULL) return -1;
    aead->ctx = NULL;
    aead->encrypt = encrypt ? 1 : 0;
    if (secret_check(secret, &info) < 0) return -1;
    uint8_t key[WG_MAX_KEY];
    /* RFC 9001 §5.1: "quic key" and "quic iv" */
    if (wg_hkdf_expand_label(secret->suite, secret->bytes, secret->len, "quic key", NULL, 0, key,
                             info.key_len) < 0 ||
        wg_hkdf_expand_label(secret->suite, secret->bytes, secret->len, "quic iv", NULL, 0,
                             aead->iv, WG_IV_LEN) < 0) {
        OPENSSL_cleanse(key, sizeof key);
        return -1;
    }
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    /* the cipher first, then the nonce length (12 bytes, RFC 9001 §5.3; the default of
     * all three AEADs, set anyway), then the key: from here on only the nonce changes */
    int ok = ctx != NULL &&
             EVP_CipherInit_ex(ctx, info.aead(), NULL, NULL, NULL, aead->encrypt) == 1 &&
             EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_IVLEN, WG_IV_LEN, NULL) == 1 &&
             EVP_CipherInit_ex(ctx, NULL, NULL, key, NULL, aead->encrypt) == 1;
    OPENSSL_cleanse(key, sizeof key);
    if (!ok) {
        EVP_CIPHER_CTX_free(ctx);
        OPENSSL_cleanse(aead->iv, WG_IV_LEN);
        return -1;
    }
    aead->ctx = ctx;
    return 0;
}

void wg_aead_free(wg_aead *aead) {
    if (aead == NULL) return;
    EVP_CIPHER_CTX_free(aead->ctx); /* NULL is fine */
    aead->ctx = NULL;
    OPENSSL_cleanse(aead->iv, WG_IV_LEN);
}

int wg_hp_init(wg_hp *hp, const wg_secret *secret) {
    suite_info info;
    if (hp == NULL) return -1;
    hp->ctx = NULL;
    hp->suite = 0;
    if (secret_check(secret, &info) < 0) return -1;
    /* RFC 9001 §5.1: "quic hp"; as long as the AEAD key (§5.4.3, §5.4.4) */
    if (wg_hkdf_expand_label(secret->suite, secret->bytes, secret->len, "quic hp", NULL, 0,
                             hp->key, info.key_len) < 0)
        return -1;
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    int ok = ctx != NULL;
    if (ok && secret->suite == WG_TLS_CHACHA20_POLY1305_SHA256) {
        /* ChaCha20's counter and nonce are the sample, so key and IV are set together
         * for each mask (wg_hp_mask); here only the cipher */
        ok = EVP_EncryptInit_ex(ctx, info.hp(), NULL, NULL, NULL) == 1;
    } else if (ok) {
        /* AES-ECB of one block: the key schedule once, no padding (RFC 9001 §5.4.3) */
        ok = EVP_EncryptInit_ex(ctx, info.hp(), NULL, hp->key, NULL) == 1 &&
             EVP_CIPHER_CTX_set_padding(ctx, 0) == 1;
    }
    if (!ok) {
        EVP_CIPHER_CTX_free(ctx);
        OPENSSL_cleanse(hp->key, sizeof hp->key);
        return -1;
    }
    hp->suite = secret->suite;
    hp->ctx = ctx;
    return 0;
}

void wg_hp_free(wg_hp *hp) {
    if (hp == NULL) return;
    EVP_CIPHER_CTX_free(hp->ctx);
    hp->ctx = NULL;
    OPENSSL_cleanse(hp->key, sizeof hp->key);
}

int wg_secret_next(const wg_secret *current, wg_secret *next) {
    suite_info info;
    if (next == NULL || secret_check(current, &info) < 0) return -1;
    /* RFC 9001 §6.1: secret_<n+1> = HKDF-Expand-Label(secret_<n>, "quic ku", "", Hash.length);
     * through a copy, so that `next` may be `current` */
    wg_secret out = {current->suite, current->len, {0}};
    if (wg_hkdf_expand_label(current->suite, current->bytes, current->len, "quic ku", NULL, 0,
                             out.bytes, out.len) < 0)
        return -1;
    *next = out;
    OPENSSL_cleanse(&out, sizeof out);
    return 0;
}

/* RFC 9001 §5.3: the nonce is the IV XOR the packet number, left-padded to 12 bytes */
static void make_nonce(const uint8_t iv[WG_IV_LEN], uint64_t pn, uint8_t nonce[WG_IV_LEN]) {
    memcpy(nonce, iv, WG_IV_LEN);
    for (int i = 0; i < 8; i++) nonce[WG_IV_LEN - 1 - i] ^= (uint8_t)(pn >> (8 * i));
}

long wg_aead_seal(wg_aead *aead, uint64_t pn, uint8_t *buf, size_t header_len, size_t plain_len,
                  size_t cap) {
    if (aead == NULL || aead->ctx == NULL || !aead->encrypt || buf == NULL) return -1;
    /* header + plaintext + tag must fit, each piece as an int for EVP, without overflow */
    if (header_len > INT_MAX || plain_len > INT_MAX || cap < WG_TAG_LEN ||
        header_len > cap - WG_TAG_LEN || plain_len > cap - WG_TAG_LEN - header_len)
        return -1;
    EVP_CIPHER_CTX *ctx = aead->ctx;
    uint8_t nonce[WG_IV_LEN];
    make_nonce(aead->iv, pn, nonce);
    int n = 0;
    uint8_t *payload = buf + header_len;
    if (EVP_CipherInit_ex(ctx, NULL, NULL, NULL, nonce, -1) != 1) return -1;
    if (header_len > 0 && EVP_CipherUpdate(ctx, NULL, &n, buf, (int)header_len) != 1) return -1;
    if (plain_len > 0 && (EVP_CipherUpdate(ctx, payload, &n, payload, (int)plain_len) != 1 ||
                          (size_t)n != plain_len))
        return -1;
    if (EVP_CipherFinal_ex(ctx, payload + plain_len, &n) != 1 || n != 0) return -1;
    if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, WG_TAG_LEN, payload + plain_len) != 1)
        return -1;
    return (long)(header_len + plain_len + WG_TAG_LEN);
}

long wg_aead_open(wg_aead *aead, uint64_t pn, uint8_t *buf, size_t header_len, size_t sealed_len) {
    if (aead == NULL || aead->ctx == NULL || aead->encrypt || buf == NULL) return -1;
    if (sealed_len < WG_TAG_LEN || header_len > INT_MAX || sealed_len > INT_MAX) return -1;
    EVP_CIPHER_CTX *ctx = aead->ctx;
    size_t plain_len = sealed_len - WG_TAG_LEN;
    uint8_t *payload = buf + header_len;
    uint8_t nonce[WG_IV_LEN];
    make_nonce(aead->iv, pn, nonce);
    int n = 0;
    if (EVP_CipherInit_ex(ctx, NULL, NULL, NULL, nonce, -1) != 1) return -1;
    if (header_len > 0 && EVP_CipherUpdate(ctx, NULL, &n, buf, (int)header_len) != 1) return -1;
    if (plain_len > 0 && (EVP_CipherUpdate(ctx, payload, &n, payload, (int)plain_len) != 1 ||
                          (size_t)n != plain_len))
        return -1;
    /* the expected tag is set before the final step, which verifies it */
    if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, WG_TAG_LEN, payload + plain_len) != 1)
        return -1;
    if (EVP_CipherFinal_ex(ctx, payload + plain_len, &n) != 1) return -1;
    return (long)plain_len;
}

int wg_hp_mask(wg_hp *hp, const uint8_t *sample, uint8_t mask[5]) {
    if (hp == NULL || hp->ctx == NULL || sample == NULL || mask == NULL) return -1;
    uint8_t out[WG_HP_SAMPLE_LEN];
    int n = 0;
    if (hp->suite == WG_TLS_CHACHA20_POLY1305_SHA256) {
        /* RFC 9001 §5.4.4: counter = sample[0..3] little-endian, nonce = sample[4..15],
         * which is OpenSSL's 16-byte ChaCha20 IV as is; mask = ChaCha20 of 5 zero bytes */
        static const uint8_t zeros[5] = {0};
        if (EVP_EncryptInit_ex(hp->ctx, NULL, NULL, hp->key, sample) != 1 ||
            EVP_EncryptUpdate(hp->ctx, out, &n, zeros, 5) != 1 || n != 5)
            return -1;
    } else {
        /* RFC 9001 §5.4.3: mask = AES-ECB(hp_key, sample) */
        if (EVP_EncryptUpdate(hp->ctx, out, &n, sample, WG_HP_SAMPLE_LEN) != 1 ||
            n != WG_HP_SAMPLE_LEN)
            return -1;
    }
    memcpy(mask, out, 5);
    return 0;
}
