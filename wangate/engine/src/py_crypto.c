/* Python-level functions over wg_keys.h and wg_packet.h, for tests and diagnostics
 * (they set up keys on every call; the data plane itself keeps them per channel).
 *
 * Bad arguments raise ValueError or TypeError; a packet that does not open raises
 * RemoteProtocolError (it came from the peer). */
#include "wg_py.h"

#include <string.h>

#include "wg_keys.h"
#include "wg_packet.h"

/* the suite's hash and key lengths, or ValueError for an unknown suite */
static int suite_sizes(int suite, size_t *secret_len, size_t *key_len) {
    if (wg_suite_sizes(suite, secret_len, key_len) < 0) {
        PyErr_Format(PyExc_ValueError,
                     "unknown cipher suite 0x%04x: one of 0x1301 (TLS_AES_128_GCM_SHA256), "
                     "0x1302 (TLS_AES_256_GCM_SHA384), 0x1303 (TLS_CHACHA20_POLY1305_SHA256)",
                     suite);
        return -1;
    }
    return 0;
}

/* a wg_secret of `suite` from a Python buffer, whose length must be the hash's */
static int secret_from(int suite, const Py_buffer *buf, wg_secret *secret) {
    size_t secret_len = 0;
    if (suite_sizes(suite, &secret_len, NULL) < 0) return -1;
    if ((size_t)buf->len != secret_len) {
        PyErr_Format(PyExc_ValueError,
                     "a secret of cipher suite 0x%04x is %zu bytes (its hash's length), not %zd",
                     suite, secret_len, buf->len);
        return -1;
    }
    secret->suite = suite;
    secret->len = secret_len;
    memcpy(secret->bytes, buf->buf, secret_len);
    return 0;
}

/* both contexts of one direction, or an exception; nothing to free on failure */
static int keys_from(int suite, const Py_buffer *buf, int encrypt, wg_aead *aead, wg_hp *hp) {
    wg_secret secret;
    if (secret_from(suite, buf, &secret) < 0) return -1;
    if (wg_aead_init(aead, &secret, encrypt) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "libcrypto could not set up the AEAD");
        return -1;
    }
    if (wg_hp_init(hp, &secret) < 0) {
        wg_aead_free(aead);
        PyErr_SetString(PyExc_RuntimeError, "libcrypto could not set up header protection");
        return -1;
    }
    return 0;
}

static void keys_free(wg_aead *aead, wg_hp *hp) {
    wg_aead_free(aead);
    wg_hp_free(hp);
}

/* a packet number: 0 .. 2^62 - 1 (RFC 9000 §12.3) */
static int check_pn(long long pn) {
    if (pn < 0 || (unsigned long long)pn > (((unsigned long long)1 << 62) - 1)) {
        PyErr_SetString(PyExc_ValueError, "a packet number is 0 .. 2**62 - 1");
        return -1;
    }
    return 0;
}

static PyObject *py_hkdf_expand_label(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"suite", "secret", "label", "length", "context", NULL};
    int suite;
    Py_buffer secret, context = {0};
    const char *label;
    Py_ssize_t label_len, length;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iy*s#n|y*:hkdf_expand_label", kwlist, &suite,
                                     &secret, &label, &label_len, &length, &context))
        return NULL;
    PyObject *out = NULL;
    size_t hash_len;
    if (suite_sizes(suite, &hash_len, NULL) < 0) goto done;
    if ((size_t)label_len != strlen(label) || label_len < 1 || label_len > 249) {
        PyErr_SetString(PyExc_ValueError, "a label is 1 to 249 bytes (RFC 8446 §7.1), no NUL");
        goto done;
    }
    if (context.buf != NULL && context.len > 255) {
        PyErr_SetString(PyExc_ValueError, "a context is at most 255 bytes (RFC 8446 §7.1)");
        goto done;
    }
    if (length < 1 || (size_t)length > 255 * hash_len) {
        PyErr_Format(PyExc_ValueError, "length is 1 to %zu bytes for this suite (RFC 5869)",
                     255 * hash_len);
        goto done;
    }
    if (secret.len < 1) {
        PyErr_SetString(PyExc_ValueError, "the secret is empty");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, length);
    if (out == NULL) goto done;
    if (wg_hkdf_expand_label(suite, secret.buf, (size_t)secret.len, label,
                             context.buf, context.buf ? (size_t)context.len : 0,
                             (uint8_t *)PyBytes_AS_STRING(out), (size_t)length) < 0) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_RuntimeError, "libcrypto failed in HKDF-Expand-Label");
    }
done:
    PyBuffer_Release(&secret);
    if (context.buf != NULL) PyBuffer_Release(&context);
    return out;
}

static PyObject *py_derive_packet_keys(PyObject *self, PyObject *args) {
    int suite;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "iy*:derive_packet_keys", &suite, &buf)) return NULL;
    wg_secret secret;
    size_t key_len = 0;
    uint8_t key[WG_MAX_KEY], iv[WG_IV_LEN], hp[WG_MAX_KEY];
    PyObject *out = NULL;
    if (secret_from(suite, &buf, &secret) < 0 || suite_sizes(suite, NULL, &key_len) < 0) goto done;
    /* RFC 9001 §5.1 */
    const uint8_t *s = secret.bytes;
    if (wg_hkdf_expand_label(suite, s, secret.len, "quic key", NULL, 0, key, key_len) < 0 ||
        wg_hkdf_expand_label(suite, s, secret.len, "quic iv", NULL, 0, iv, WG_IV_LEN) < 0 ||
        wg_hkdf_expand_label(suite, s, secret.len, "quic hp", NULL, 0, hp, key_len) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "libcrypto failed in HKDF-Expand-Label");
        goto done;
    }
    out = Py_BuildValue("(y#y#y#)", key, (Py_ssize_t)key_len, iv, (Py_ssize_t)WG_IV_LEN, hp,
                        (Py_ssize_t)key_len);
done:
    PyBuffer_Release(&buf);
    return out;
}

static PyObject *py_next_secret(PyObject *self, PyObject *args) {
    int suite;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "iy*:next_secret", &suite, &buf)) return NULL;
    wg_secret secret, next;
    PyObject *out = NULL;
    if (secret_from(suite, &buf, &secret) < 0) goto done;
    if (wg_secret_next(&secret, &next) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "libcrypto failed in HKDF-Expand-Label");
        goto done;
    }
    out = PyBytes_FromStringAndSize((const char *)next.bytes, (Py_ssize_t)next.len);
done:
    PyBuffer_Release(&buf);
    return out;
}

static PyObject *py_header_protection_mask(PyObject *self, PyObject *args) {
    int suite;
    Py_buffer buf, sample;
    if (!PyArg_ParseTuple(args, "iy*y*:header_protection_mask", &suite, &buf, &sample)) return NULL;
    PyObject *out = NULL;
    wg_secret secret;
    wg_hp hp = {0};
    uint8_t mask[5];
    if (secret_from(suite, &buf, &secret) < 0) goto done;
    if (sample.len != WG_HP_SAMPLE_LEN) {
        PyErr_SetString(PyExc_ValueError, "a header-protection sample is 16 bytes");
        goto done;
    }
    if (wg_hp_init(&hp, &secret) < 0 || wg_hp_mask(&hp, sample.buf, mask) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "libcrypto failed in header protection");
        goto done;
    }
    out = PyBytes_FromStringAndSize((const char *)mask, 5);
done:
    wg_hp_free(&hp);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&sample);
    return out;
}

static PyObject *py_seal_short_packet(PyObject *self, PyObject *args) {
    int suite, key_phase;
    long long pn;
    Py_buffer secret, cid, frames;
    if (!PyArg_ParseTuple(args, "iy*y*pLy*:seal_short_packet", &suite, &secret, &cid, &key_phase,
                          &pn, &frames))
        return NULL;
    PyObject *out = NULL;
    wg_aead aead = {0};
    wg_hp hp = {0};
    int have_keys = 0;
    if (cid.len != WG_CID_LEN) {
        PyErr_Format(PyExc_ValueError, "a data-plane connection ID is %d bytes, not %zd",
                     WG_CID_LEN, cid.len);
        goto done;
    }
    if (check_pn(pn) < 0) goto done;
    if (frames.len > 65535) {
        PyErr_SetString(PyExc_ValueError, "at most 65535 bytes of frames");
        goto done;
    }
    if (keys_from(suite, &secret, 1, &aead, &hp) < 0) goto done;
    have_keys = 1;
    size_t cap = WG_PACKET_OVERHEAD + (size_t)frames.len;
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap);
    if (out == NULL) goto done;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
    wg_short_header(p, cid.buf, key_phase, (uint64_t)pn);
    if (frames.len > 0) memcpy(p + WG_SHORT_HEADER_LEN, frames.buf, (size_t)frames.len);
    long n = wg_packet_seal(&aead, &hp, (uint64_t)pn, p, (size_t)frames.len, cap);
    if (n < 0 || (size_t)n != cap) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_RuntimeError, "libcrypto failed to seal the packet");
    }
done:
    if (have_keys) keys_free(&aead, &hp);
    PyBuffer_Release(&secret);
    PyBuffer_Release(&cid);
    PyBuffer_Release(&frames);
    return out;
}

static PyObject *py_open_short_packet(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"suite", "secret", "packet", "largest_pn", NULL};
    int suite;
    long long largest = -1;
    Py_buffer secret, packet;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iy*y*|L:open_short_packet", kwlist, &suite,
                                     &secret, &packet, &largest))
        return NULL;
    PyObject *out = NULL;
    uint8_t *copy = NULL;
    wg_aead aead = {0};
    wg_hp hp = {0};
    int have_keys = 0;
    if (largest < -1 || largest > (long long)(((unsigned long long)1 << 62) - 1)) {
        PyErr_SetString(PyExc_ValueError, "largest_pn is -1 (none yet) or a packet number");
        goto done;
    }
    if (keys_from(suite, &secret, 0, &aead, &hp) < 0) goto done;
    have_keys = 1;
    /* opened in a copy: unmasking and decryption work in place */
    size_t len = (size_t)packet.len;
    copy = PyMem_Malloc(len > 0 ? len : 1);
    if (copy == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (len > 0) memcpy(copy, packet.buf, len);
    int key_phase = 0;
    uint64_t pn = 0;
    if (wg_packet_unmask(&hp, copy, len, (int64_t)largest, &key_phase, &pn) < 0) {
        PyErr_Format(wg_RemoteProtocolError,
                     "not a data-plane short-header packet (%zu bytes): too short, or its "
                     "header is invalid once unmasked", len);
        goto done;
    }
    long n = wg_packet_open(&aead, pn, copy, len);
    if (n < 0) {
        PyErr_SetString(wg_RemoteProtocolError,
                        "the packet does not verify (forged, damaged, or another key)");
        goto done;
    }
    out = Py_BuildValue("(iKy#)", key_phase, (unsigned long long)pn,
                        (const char *)copy + WG_SHORT_HEADER_LEN, (Py_ssize_t)n);
done:
    if (have_keys) keys_free(&aead, &hp);
    PyMem_Free(copy);
    PyBuffer_Release(&secret);
    PyBuffer_Release(&packet);
    return out;
}

static PyObject *py_seal_packet(PyObject *self, PyObject *args) {
    int suite;
    Py_ssize_t pn_offset;
    long long pn;
    Py_buffer secret, header, payload;
    if (!PyArg_ParseTuple(args, "iy*y*nLy*:seal_packet", &suite, &secret, &header, &pn_offset, &pn,
                          &payload))
        return NULL;
    PyObject *out = NULL;
    wg_aead aead = {0};
    wg_hp hp = {0};
    int have_keys = 0;
    if (header.len < 1 || header.len > 65535 || payload.len > 65535) {
        PyErr_SetString(PyExc_ValueError, "a header of 1 to 65535 bytes, at most 65535 of payload");
        goto done;
    }
    /* the header ends with the packet number, PP + 1 bytes of it (RFC 9000 §17) */
    Py_ssize_t pn_len = (((const uint8_t *)header.buf)[0] & 0x03) + 1;
    if (pn_offset < 1 || pn_offset + pn_len != header.len) {
        PyErr_Format(PyExc_ValueError,
                     "the header must end with its %zd-byte packet number: pn_offset %zd "
                     "for a %zd-byte header", pn_len, header.len - pn_len, header.len);
        goto done;
    }
    if (check_pn(pn) < 0) goto done;
    if (keys_from(suite, &secret, 1, &aead, &hp) < 0) goto done;
    have_keys = 1;
    size_t cap = (size_t)header.len + (size_t)payload.len + WG_TAG_LEN;
    if (cap - (size_t)pn_offset < 4 + WG_HP_SAMPLE_LEN) {
        PyErr_SetString(PyExc_ValueError,
                        "too short to sample for header protection (RFC 9001 §5.4.2)");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap);
    if (out == NULL) goto done;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
    memcpy(p, header.buf, (size_t)header.len);
    if (payload.len > 0) memcpy(p + header.len, payload.buf, (size_t)payload.len);
    long n = wg_aead_seal(&aead, (uint64_t)pn, p, (size_t)header.len, (size_t)payload.len, cap);
    if (n < 0 || (size_t)n != cap || wg_header_protect(&hp, p, cap, (size_t)pn_offset) < 0) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_RuntimeError, "libcrypto failed to seal the packet");
    }
done:
    if (have_keys) keys_free(&aead, &hp);
    PyBuffer_Release(&secret);
    PyBuffer_Release(&header);
    PyBuffer_Release(&payload);
    return out;
}

static PyObject *py_derive_data_plane(PyObject *self, PyObject *args) {
    int suite;
    Py_buffer traffic;
    if (!PyArg_ParseTuple(args, "iy*:derive_data_plane", &suite, &traffic)) return NULL;
    PyObject *out = NULL;
    wg_secret check, dp;
    uint8_t cid[WG_CID_LEN];
    if (secret_from(suite, &traffic, &check) < 0) goto done; /* its length, with a message */
    if (wg_data_plane_derive(suite, traffic.buf, (size_t)traffic.len, &dp, cid) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "libcrypto failed in HKDF-Expand-Label");
        goto done;
    }
    out = Py_BuildValue("(y#y#)", dp.bytes, (Py_ssize_t)dp.len, cid, (Py_ssize_t)WG_CID_LEN);
done:
    PyBuffer_Release(&traffic);
    return out;
}

static PyObject *py_decode_packet_number(PyObject *self, PyObject *args) {
    long long largest;
    unsigned long long truncated;
    int nbits;
    if (!PyArg_ParseTuple(args, "LKi:decode_packet_number", &largest, &truncated, &nbits))
        return NULL;
    if (nbits != 8 && nbits != 16 && nbits != 24 && nbits != 32) {
        PyErr_SetString(PyExc_ValueError, "pn_nbits is 8, 16, 24 or 32 (RFC 9000 §17.1)");
        return NULL;
    }
    if (largest < -1 || largest > (long long)(((unsigned long long)1 << 62) - 1)) {
        PyErr_SetString(PyExc_ValueError, "largest_pn is -1 (none yet) or a packet number");
        return NULL;
    }
    if (truncated >> nbits) {
        PyErr_SetString(PyExc_ValueError,
                        "the truncated packet number has more than pn_nbits bits");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(wg_decode_pn((int64_t)largest, truncated, (unsigned)nbits));
}

PyMethodDef wg_py_crypto_methods[] = {
    {"hkdf_expand_label", (PyCFunction)(void (*)(void))py_hkdf_expand_label,
     METH_VARARGS | METH_KEYWORDS,
     "hkdf_expand_label(suite, secret, label, length, context=b'') -> bytes\n\n"
     "HKDF-Expand-Label of RFC 8446 §7.1 (\"tls13 \" + label) with the suite's hash."},
    {"derive_packet_keys", py_derive_packet_keys, METH_VARARGS,
     "derive_packet_keys(suite, secret) -> (key, iv, hp)\n\n"
     "RFC 9001 §5.1: \"quic key\", \"quic iv\", \"quic hp\"."},
    {"next_secret", py_next_secret, METH_VARARGS,
     "next_secret(suite, secret) -> bytes\n\n"
     "RFC 9001 §6.1: the next key phase's secret (\"quic ku\")."},
    {"header_protection_mask", py_header_protection_mask, METH_VARARGS,
     "header_protection_mask(suite, secret, sample) -> bytes\n\n"
     "The 5-byte mask of RFC 9001 §5.4.3 / §5.4.4 from a 16-byte sample."},
    {"seal_short_packet", py_seal_short_packet, METH_VARARGS,
     "seal_short_packet(suite, secret, cid, key_phase, pn, frames) -> bytes\n\n"
     "A data-plane short-header packet (proto/engine.md), sealed and header-protected."},
    {"open_short_packet", (PyCFunction)(void (*)(void))py_open_short_packet,
     METH_VARARGS | METH_KEYWORDS,
     "open_short_packet(suite, secret, packet, largest_pn=-1) -> (key_phase, pn, frames)\n\n"
     "Removes header protection, decodes the packet number against largest_pn (RFC 9000\n"
     "§A.3) and opens the payload; RemoteProtocolError if any of it fails."},
    {"seal_packet", py_seal_packet, METH_VARARGS,
     "seal_packet(suite, secret, header, pn_offset, pn, payload) -> bytes\n\n"
     "Any QUIC v1 packet: `header` (ending with its packet number at pn_offset) is the\n"
     "associated data, then header protection (long or short) per RFC 9001 §5.4."},
    {"derive_data_plane", py_derive_data_plane, METH_VARARGS,
     "derive_data_plane(suite, traffic_secret) -> (dp_secret, cid)\n\n"
     "A direction's data-plane secret and its receiver's connection ID (proto/engine.md)."},
    {"decode_packet_number", py_decode_packet_number, METH_VARARGS,
     "decode_packet_number(largest_pn, truncated, pn_nbits) -> int\n\nRFC 9000 §A.3."},
    {NULL, NULL, 0, NULL},
};
