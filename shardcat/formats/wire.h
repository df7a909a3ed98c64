/* What the native extensions share (shardcat/formats/_scan.c, shardcat/readers/_hot.c):
 * CRC32C (SSE4.2 where the CPU has it: call crc_setup() once at module init) and
 * the protobuf wire primitives (varint, tag, delimited, skip; OK or DEFER), and
 * append_new (a new reference appended to a list). */
#ifndef SHARDCAT_WIRE_H
#define SHARDCAT_WIRE_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && !defined(SHARDCAT_NO_HW_CRC)
#include <nmmintrin.h>
#define HAVE_X86 1
#endif

/* append a new reference (stolen) to a list: 0, or -1 (with an error set) */
static inline int append_new(PyObject *list, PyObject *value) {
    if (value == NULL) return -1;
    int rc = PyList_Append(list, value);
    Py_DECREF(value);
    return rc;
}

/* -- CRC32C ------------------------------------------------------------------ */

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc_soft(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= c;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xFF];
    return c ^ 0xFFFFFFFFu;
}

#ifdef HAVE_X86
__attribute__((target("sse4.2"))) static uint32_t crc_hw(const uint8_t *p, size_t n) {
    uint64_t c = 0xFFFFFFFFu;
#ifdef __x86_64__
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
#endif
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return c32 ^ 0xFFFFFFFFu;
}
#endif

static uint32_t (*crc32c)(const uint8_t *, size_t) = crc_soft;

static void crc_setup(void) {
    crc_init();
#ifdef HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) crc32c = crc_hw;
#endif
}

enum { OK = 0, DEFER = 1 };

/* a varint of at most 10 bytes whose 10th byte is 0 or 1 */
static inline int varint(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (p >= end) return DEFER;
        uint8_t b = *p++;
        if (shift == 63 && b > 1) return DEFER;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = v;
            *pp = p;
            return OK;
        }
    }
    return DEFER;
}

/* one tag: field number and wire type */
static inline int tag(const uint8_t **pp, const uint8_t *end, uint32_t *field, int *wt) {
    uint64_t t;
    if (varint(pp, end, &t)) return DEFER;
    if (t >> 32 || (t >> 3) == 0) return DEFER;
    *field = (uint32_t)(t >> 3);
    *wt = (int)(t & 7);
    return OK;
}

/* a length-delimited payload: [*start, *stop) */
static inline int delimited(const uint8_t **pp, const uint8_t *end, const uint8_t **start,
                            const uint8_t **stop) {
    uint64_t n;
    if (varint(pp, end, &n)) return DEFER;
    if (n > (uint64_t)(end - *pp)) return DEFER;
    *start = *pp;
    *stop = *pp + n;
    *pp = *stop;
    return OK;
}

/* skip an unknown field of wire type wt (groups are not settled here) */
static inline int skip(const uint8_t **pp, const uint8_t *end, int wt) {
    uint64_t v;
    const uint8_t *a, *b;
    switch (wt) {
    case 0:
        return varint(pp, end, &v);
    case 1:
        if (end - *pp < 8) return DEFER;
        *pp += 8;
        return OK;
    case 2:
        return delimited(pp, end, &a, &b);
    case 5:
        if (end - *pp < 4) return DEFER;
        *pp += 4;
        return OK;
    default:
        return DEFER;
    }
}
#endif
