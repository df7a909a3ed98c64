/* The native TFRecord scanner: framing, both masked CRC32C checks and the
 * protobuf wire walk of Example / SequenceExample.context that finds the key
 * feature and the scalar fields, exactly as the pure-Python reference scan
 * (shardcat/formats/tfrecord.py: _scan, _key_of, _scalars) defines them.
 *
 * It settles the well-formed common case only. For any record it cannot
 * settle with certainty (a framing error, a frame running past the buffer, a
 * malformed or unusual wire: duplicate map keys, a repeated Features or
 * Feature kind that protobuf would merge, groups, a missing or non-UTF-8 key,
 * ...) it stops and returns that record's offset; the Python side then runs
 * the reference scan on that one record (so errors and odd cases are the
 * reference's by construction) and calls back in after it.
 *
 * Python API (see shardcat/formats/native.py):
 *   tfrecord(buf, pos, base, key, fields, keys, offsets, lengths, columns, f32)
 *       -> (pos, done)
 *   buf: any contiguous buffer (bytes, mmap, memoryview; a whole file, or a
 *   chunk of a decompressed stream); pos: where to start in it; base: the
 *   stream offset of buf[0] (offsets appended are base + position in buf);
 *   key: feature name or None; fields: bool; keys/offsets/lengths: lists the
 *   records are appended to; columns: dict name -> list (padded with None up to
 *   the record's ordinal before appending); f32: the Python float32_shortest,
 *   called for the rare floats this module does not settle itself.
 *   done: True when pos reached the end of buf; False when the record at pos
 *   is not settled here: it runs past the end of buf (a stream reads more),
 *   or the reference must handle it.
 *   The crc of each record settled (CRC32C of its payload, unmasked: the check
 *   the catalog stores) is appended to the list `checks` passed after `lengths`
 *   (tfrecord and recordio alike).
 *   crc32c(data) -> int: CRC32C of a buffer, the readers' per-read check;
 *   masked_crc(data) -> int; float32_shortest(x, fallback) -> float;
 *   hardware_crc() -> whether CRC32C runs on SSE4.2 (for tests).
 * Build with -DSHARDCAT_NO_HW_CRC to test the table CRC on an x86 machine.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

static inline uint32_t mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xA282EAD8u; }

static uint32_t masked(const uint8_t *p, size_t n) { return mask(crc32c(p, n)); }

static inline uint64_t rd64(const uint8_t *p) {
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
           (uint64_t)p[7] << 56;
}

static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* -- float32 shortest decimal -------------------------------------------------- */

/* float32_shortest for a float32 f: the Python float, NULL with an error set.
 * Mirrors formats.float32_shortest: integers and non-finite values unchanged;
 * one %.6g round trip; else the closest 7-, 8- or 9-digit decimal that rounds
 * back (numpy's shortest repr with symmetric margins). Powers of two (unequal
 * margins) and a candidate lying exactly on a rounding boundary are handed to
 * the Python function `fallback`. */
static PyObject *f32_shortest(float f, PyObject *fallback) {
    double v = (double)f;
    char text[40];
    if (!isfinite(v) || v == floor(v)) return PyFloat_FromDouble(v);
    snprintf(text, sizeof text, "%.6g", v);
    double t = strtod(text, NULL);
    if ((float)t == f) return PyFloat_FromDouble(t);
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7FFFFFu) != 0) { /* not a power of two (nor a subnormal power) */
        float up = nextafterf(f, INFINITY), down = nextafterf(f, -INFINITY);
        double hi = ((double)f + (double)up) / 2, lo = ((double)f + (double)down) / 2;
        for (int digits = 7; digits <= 9; digits++) {
            snprintf(text, sizeof text, "%.*e", digits - 1, v);
            t = strtod(text, NULL);
            if ((float)t == f) {
                if (t == hi || t == lo) break; /* on a boundary: the reference decides */
                return PyFloat_FromDouble(t);
            }
        }
    }
    PyObject *arg = PyFloat_FromDouble(v);
    if (arg == NULL) return NULL;
    PyObject *out = PyObject_CallOneArg(fallback, arg);
    Py_DECREF(arg);
    return out;
}

/* float32_shortest through a direct-mapped cache by bit pattern (fields repeat
 * their values: labels, scores rounded to a few digits); entries hold references
 * for the life of the process */
#define F32_CACHE 4096
static struct {
    uint32_t bits;
    PyObject *value;
} f32_cache[F32_CACHE];

static PyObject *f32_cached(float f, PyObject *fallback) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    uint32_t slot = (bits * 2654435761u) >> 20; /* 12 bits */
    if (f32_cache[slot].value != NULL && f32_cache[slot].bits == bits) {
        Py_INCREF(f32_cache[slot].value);
        return f32_cache[slot].value;
    }
    PyObject *value = f32_shortest(f, fallback);
    if (value == NULL) return NULL;
    Py_XSETREF(f32_cache[slot].value, Py_NewRef(value));
    f32_cache[slot].bits = bits;
    return value;
}

/* -- protobuf wire walk ------------------------------------------------------- */

enum { K_NONE = 0, K_BYTES = 1, K_FLOAT = 2, K_INT64 = 3 };

typedef struct {
    const uint8_t *name;
    size_t nlen;
    int kind;
    Py_ssize_t count;     /* values in the list */
    const uint8_t *bytes; /* first value (bytes_list) */
    size_t blen;
    uint64_t ival; /* first value (int64_list) */
    float fval;    /* first value (float_list) */
} Feat;


static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (i + len > n) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += len;
    }
    return 1;
}

/* the values of one BytesList / FloatList / Int64List */
static int list_values(const uint8_t *p, const uint8_t *end, int kind, Feat *f) {
    while (p < end) {
        uint32_t field;
        int wt;
        if (tag(&p, end, &field, &wt)) return DEFER;
        if (field != 1) {
            if (skip(&p, end, wt)) return DEFER;
            continue;
        }
        if (kind == K_BYTES) {
            const uint8_t *a, *b;
            if (wt != 2 || delimited(&p, end, &a, &b)) return DEFER;
            if (f->count++ == 0) {
                f->bytes = a;
                f->blen = (size_t)(b - a);
            }
        } else if (kind == K_FLOAT) {
            if (wt == 5) {
                if (end - p < 4) return DEFER;
                if (f->count++ == 0) {
                    uint32_t u = rd32(p);
                    memcpy(&f->fval, &u, 4);
                }
                p += 4;
            } else if (wt == 2) {
                const uint8_t *a, *b;
                if (delimited(&p, end, &a, &b) || (b - a) % 4) return DEFER;
                if (a < b && f->count == 0) {
                    uint32_t u = rd32(a);
                    memcpy(&f->fval, &u, 4);
                }
                f->count += (b - a) / 4;
            } else {
                return DEFER;
            }
        } else {
            uint64_t v;
            if (wt == 0) {
                if (varint(&p, end, &v)) return DEFER;
                if (f->count++ == 0) f->ival = v;
            } else if (wt == 2) {
                const uint8_t *a, *b;
                if (delimited(&p, end, &a, &b)) return DEFER;
                while (a < b) {
                    if (varint(&a, b, &v)) return DEFER;
                    if (f->count++ == 0) f->ival = v;
                }
            } else {
                return DEFER;
            }
        }
    }
    return OK;
}

/* one Feature message: its kind and first value; two kinds set (or one kind
 * twice, which protobuf merges) are the reference's */
static int feature(const uint8_t *p, const uint8_t *end, Feat *f) {
    f->kind = K_NONE;
    f->count = 0;
    int seen = 0;
    while (p < end) {
        uint32_t field;
        int wt;
        if (tag(&p, end, &field, &wt)) return DEFER;
        if (field >= 1 && field <= 3) {
            const uint8_t *a, *b;
            if (wt != 2 || seen++ || delimited(&p, end, &a, &b)) return DEFER;
            f->kind = (int)field; /* 1 bytes, 2 float, 3 int64 */
            if (list_values(a, b, f->kind, f)) return DEFER;
        } else if (skip(&p, end, wt)) {
            return DEFER;
        }
    }
    return OK;
}

/* a map entry (key = 1 string, value = 2): the key's bytes, the value's range */
static int map_entry(const uint8_t *p, const uint8_t *end, const uint8_t **name, size_t *nlen,
                     const uint8_t **value, const uint8_t **vend) {
    int have_key = 0, have_value = 0;
    *value = *vend = NULL;
    while (p < end) {
        uint32_t field;
        int wt;
        if (tag(&p, end, &field, &wt)) return DEFER;
        if (field == 1 || field == 2) {
            const uint8_t *a, *b;
            if (wt != 2 || delimited(&p, end, &a, &b)) return DEFER;
            if (field == 1) {
                if (have_key++) return DEFER;
                *name = a;
                *nlen = (size_t)(b - a);
            } else {
                if (have_value++) return DEFER; /* merged by protobuf */
                *value = a;
                *vend = b;
            }
        } else {
            return DEFER; /* upb keeps an entry with unknown fields out of the map */
        }
    }
    if (!have_key || !utf8_valid(*name, *nlen)) return DEFER;
    return OK;
}

/* FeatureLists (SequenceExample field 2): checked only to be well formed */
static int feature_lists(const uint8_t *p, const uint8_t *end) {
    Feat f;
    while (p < end) {
        uint32_t field;
        int wt;
        if (tag(&p, end, &field, &wt)) return DEFER;
        if (field != 1) {
            if (skip(&p, end, wt)) return DEFER;
            continue;
        }
        const uint8_t *a, *b, *name, *v, *ve;
        size_t nlen;
        if (wt != 2 || delimited(&p, end, &a, &b)) return DEFER;
        if (map_entry(a, b, &name, &nlen, &v, &ve)) return DEFER;
        while (v != NULL && v < ve) { /* FeatureList: repeated Feature feature = 1 */
            if (tag(&v, ve, &field, &wt)) return DEFER;
            if (field != 1) {
                if (skip(&v, ve, wt)) return DEFER;
                continue;
            }
            const uint8_t *fa, *fb;
            if (wt != 2 || delimited(&v, ve, &fa, &fb) || feature(fa, fb, &f)) return DEFER;
        }
    }
    return OK;
}

typedef struct {
    Feat *feats;
    Py_ssize_t n, cap;
} Record;

/* the features of one payload (Example.features or SequenceExample.context) */
static int record(const uint8_t *p, const uint8_t *end, Record *r) {
    int have_features = 0;
    r->n = 0;
    while (p < end) {
        uint32_t field;
        int wt;
        if (tag(&p, end, &field, &wt)) return DEFER;
        const uint8_t *a, *b;
        if (field == 2) {
            if (wt != 2 || delimited(&p, end, &a, &b) || feature_lists(a, b)) return DEFER;
            continue;
        }
        if (field != 1) {
            if (skip(&p, end, wt)) return DEFER;
            continue;
        }
        if (wt != 2 || have_features++ || delimited(&p, end, &a, &b)) return DEFER;
        while (a < b) { /* Features: map<string, Feature> feature = 1 */
            if (tag(&a, b, &field, &wt)) return DEFER;
            if (field != 1) {
                if (skip(&a, b, wt)) return DEFER;
                continue;
            }
            const uint8_t *ea, *eb, *name, *v, *ve;
            size_t nlen;
            if (wt != 2 || delimited(&a, b, &ea, &eb)) return DEFER;
            if (map_entry(ea, eb, &name, &nlen, &v, &ve)) return DEFER;
            for (Py_ssize_t i = 0; i < r->n; i++) /* the last one would win: reference */
                if (r->feats[i].nlen == nlen && memcmp(r->feats[i].name, name, nlen) == 0)
                    return DEFER;
            if (r->n == r->cap) {
                Py_ssize_t cap = r->cap ? 2 * r->cap : 16;
                Feat *grown = realloc(r->feats, (size_t)cap * sizeof(Feat));
                if (grown == NULL) return DEFER;
                r->feats = grown;
                r->cap = cap;
            }
            Feat *f = &r->feats[r->n++];
            f->name = name;
            f->nlen = nlen;
            f->kind = K_NONE;
            f->count = 0;
            if (v != NULL && feature(v, ve, f)) return DEFER;
        }
    }
    return OK;
}

/* -- columns ------------------------------------------------------------------- */

typedef struct {
    const char *name; /* the UTF-8 of key */
    Py_ssize_t nlen;
    PyObject *key;  /* a reference, dropped at the end of the call */
    PyObject *list; /* borrowed from the columns dict */
} Column;

typedef struct {
    PyObject *dict;
    Column *cols;
    Py_ssize_t n, cap;
} Columns;

static PyObject *column(Columns *c, const uint8_t *name, size_t nlen) {
    for (Py_ssize_t i = 0; i < c->n; i++)
        if ((size_t)c->cols[i].nlen == nlen && memcmp(c->cols[i].name, name, nlen) == 0)
            return c->cols[i].list;
    PyObject *key = PyUnicode_DecodeUTF8((const char *)name, (Py_ssize_t)nlen, NULL);
    if (key == NULL) return NULL;
    PyObject *list = PyDict_GetItemWithError(c->dict, key);
    if (list == NULL) {
        if (PyErr_Occurred()) goto fail;
        list = PyList_New(0);
        if (list == NULL) goto fail;
        int rc = PyDict_SetItem(c->dict, key, list);
        Py_DECREF(list);
        if (rc < 0) goto fail;
    } else if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "columns values must be lists");
        goto fail;
    }
    if (c->n == c->cap) {
        Py_ssize_t cap = c->cap ? 2 * c->cap : 16;
        Column *grown = realloc(c->cols, (size_t)cap * sizeof(Column));
        if (grown == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        c->cols = grown;
        c->cap = cap;
    }
    Py_ssize_t len;
    const char *utf8 = PyUnicode_AsUTF8AndSize(key, &len); /* lives as long as key */
    if (utf8 == NULL) goto fail;
    c->cols[c->n++] = (Column){utf8, len, key, list};
    return list;
fail:
    Py_DECREF(key);
    return NULL;
}

/* append value (stolen) at ordinal i of list, padding with None */
static int put(PyObject *list, Py_ssize_t i, PyObject *value) {
    if (value == NULL) return -1;
    while (PyList_GET_SIZE(list) < i)
        if (PyList_Append(list, Py_None) < 0) {
            Py_DECREF(value);
            return -1;
        }
    int rc = PyList_Append(list, value);
    Py_DECREF(value);
    return rc;
}

/* -- the scan ---------------------------------------------------------------- */

static PyObject *py_tfrecord(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t pos, base;
    PyObject *key_obj, *keys, *offsets, *lengths, *checks, *dict, *fallback;
    int want_fields;
    if (!PyArg_ParseTuple(args, "y*nnOpO!O!O!O!O!O", &view, &pos, &base, &key_obj, &want_fields,
                          &PyList_Type, &keys, &PyList_Type, &offsets, &PyList_Type, &lengths,
                          &PyList_Type, &checks, &PyDict_Type, &dict, &fallback))
        return NULL;
    const char *key = NULL;
    Py_ssize_t key_len = 0;
    if (key_obj != Py_None) {
        key = PyUnicode_AsUTF8AndSize(key_obj, &key_len);
        if (key == NULL) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    const uint8_t *buf = view.buf;
    Py_ssize_t size = view.len;
    Record rec = {NULL, 0, 0};
    Columns cols = {dict, NULL, 0, 0};
    int done = 0, failed = 0;
    int parse = key != NULL || want_fields;
    if (pos < 0) pos = 0;
    while (1) {
        Py_ssize_t left = size - pos;
        if (left <= 0) {
            done = 1;
            break;
        }
        if (left < 12) break;
        const uint8_t *h = buf + pos;
        uint64_t length = rd64(h);
        if (masked(h, 8) != rd32(h + 8)) break;
        if (length > (uint64_t)(left - 16)) break;
        const uint8_t *data = h + 12;
        uint32_t crc = crc32c(data, (size_t)length);
        if (mask(crc) != rd32(data + length)) break;
        Py_ssize_t ordinal = PyList_GET_SIZE(offsets);
        Feat *keyf = NULL;
        if (parse) {
            if (record(data, data + length, &rec)) break;
            if (key != NULL) {
                for (Py_ssize_t i = 0; i < rec.n; i++)
                    if (rec.feats[i].nlen == (size_t)key_len &&
                        memcmp(rec.feats[i].name, key, (size_t)key_len) == 0)
                        keyf = &rec.feats[i];
                if (keyf == NULL || keyf->count == 0) break; /* the reference's error */
                if (keyf->kind == K_BYTES && !utf8_valid(keyf->bytes, keyf->blen)) break;
            }
        }
        /* settled: append */
        PyObject *k;
        if (keyf == NULL) {
            Py_INCREF(Py_None);
            k = Py_None;
        } else if (keyf->kind == K_BYTES) {
            k = PyUnicode_DecodeUTF8((const char *)keyf->bytes, (Py_ssize_t)keyf->blen, NULL);
        } else if (keyf->kind == K_INT64) {
            k = PyUnicode_FromFormat("%lld", (long long)(int64_t)keyf->ival);
        } else {
            PyObject *fl = PyFloat_FromDouble((double)keyf->fval);
            k = fl == NULL ? NULL : PyObject_Str(fl);
            Py_XDECREF(fl);
        }
        if (append_new(keys, k) < 0 || append_new(offsets, PyLong_FromSsize_t(base + pos)) < 0 ||
            append_new(lengths, PyLong_FromUnsignedLongLong(length)) < 0 ||
            append_new(checks, PyLong_FromUnsignedLong(crc)) < 0) {
            failed = 1;
            break;
        }
        if (want_fields) {
            for (Py_ssize_t i = 0; i < rec.n && !failed; i++) {
                Feat *f = &rec.feats[i];
                if (f == keyf || f->count != 1) continue;
                if (key != NULL && f->nlen == (size_t)key_len &&
                    memcmp(f->name, key, (size_t)key_len) == 0)
                    continue;
                PyObject *value;
                if (f->kind == K_BYTES) {
                    if (f->blen > 256 || !utf8_valid(f->bytes, f->blen)) continue;
                    value = PyUnicode_DecodeUTF8((const char *)f->bytes, (Py_ssize_t)f->blen, NULL);
                } else if (f->kind == K_INT64) {
                    value = PyLong_FromLongLong((long long)(int64_t)f->ival);
                } else if (f->kind == K_FLOAT) {
                    value = f32_cached(f->fval, fallback);
                } else {
                    continue;
                }
                PyObject *list = value == NULL ? NULL : column(&cols, f->name, f->nlen);
                if (list == NULL) {
                    Py_XDECREF(value);
                    failed = 1;
                } else if (put(list, ordinal, value) < 0) {
                    failed = 1;
                }
            }
            if (failed) break;
        }
        pos += 16 + (Py_ssize_t)length;
    }
    free(rec.feats);
    for (Py_ssize_t i = 0; i < cols.n; i++) Py_DECREF(cols.cols[i].key);
    free(cols.cols);
    PyBuffer_Release(&view);
    if (failed) return NULL;
    return Py_BuildValue("nO", pos, done ? Py_True : Py_False);
}

/* -- RecordIO framing ----------------------------------------------------------- */

/* recordio(buf, pos, want_header, offsets, lengths, checks, fields, fallback) -> (pos, done):
 * whole (cflag 0) frames with the right magic that fit in the buffer; in header
 * datasets an IRHeader with flag 0 gives flag, label (not NaN), id and id2 (when
 * they fit int64). Stops at anything else (a part of a split record, bad magic,
 * truncation, flag > 0): the reference takes that record. */
static PyObject *py_recordio(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t pos;
    int want_header;
    PyObject *offsets, *lengths, *checks, *dict, *fallback;
    if (!PyArg_ParseTuple(args, "y*npO!O!O!O!O", &view, &pos, &want_header, &PyList_Type,
                          &offsets, &PyList_Type, &lengths, &PyList_Type, &checks, &PyDict_Type,
                          &dict, &fallback))
        return NULL;
    const uint8_t *buf = view.buf;
    Py_ssize_t size = view.len;
    Columns cols = {dict, NULL, 0, 0};
    int done = 0, failed = 0;
    if (pos < 0) pos = 0;
    while (1) {
        Py_ssize_t left = size - pos;
        if (left <= 0) {
            done = 1;
            break;
        }
        if (left < 8) break;
        const uint8_t *h = buf + pos;
        if (rd32(h) != 0xCED7230Au) break;
        uint32_t lrecord = rd32(h + 4);
        if (lrecord >> 29 != 0) break;
        Py_ssize_t n = (Py_ssize_t)(lrecord & 0x1FFFFFFFu);
        Py_ssize_t span = 8 + ((n + 3) & ~(Py_ssize_t)3);
        if (span > left) break;
        const uint8_t *data = h + 8;
        int header = want_header && n >= 24;
        if (header && rd32(data) != 0) break; /* a label array: the reference */
        Py_ssize_t ordinal = PyList_GET_SIZE(offsets);
        if (append_new(offsets, PyLong_FromSsize_t(pos)) < 0 ||
            append_new(lengths, PyLong_FromSsize_t(span)) < 0 ||
            append_new(checks, PyLong_FromUnsignedLong(crc32c(data, (size_t)n))) < 0) {
            failed = 1;
            break;
        }
        if (header) {
            float label;
            uint32_t bits = rd32(data + 4);
            memcpy(&label, &bits, 4);
            uint64_t id = rd64(data + 8), id2 = rd64(data + 16);
            PyObject *list = column(&cols, (const uint8_t *)"flag", 4);
            if (list == NULL || put(list, ordinal, PyLong_FromLong(0)) < 0) failed = 1;
            if (!failed && !isnan(label)) {
                list = column(&cols, (const uint8_t *)"label", 5);
                if (list == NULL || put(list, ordinal, f32_cached(label, fallback)) < 0) failed = 1;
            }
            if (!failed && id <= (uint64_t)INT64_MAX) {
                list = column(&cols, (const uint8_t *)"id", 2);
                if (list == NULL || put(list, ordinal, PyLong_FromUnsignedLongLong(id)) < 0)
                    failed = 1;
            }
            if (!failed && id2 <= (uint64_t)INT64_MAX) {
                list = column(&cols, (const uint8_t *)"id2", 3);
                if (list == NULL || put(list, ordinal, PyLong_FromUnsignedLongLong(id2)) < 0)
                    failed = 1;
            }
            if (failed) break;
        }
        pos += span;
    }
    for (Py_ssize_t i = 0; i < cols.n; i++) Py_DECREF(cols.cols[i].key);
    free(cols.cols);
    PyBuffer_Release(&view);
    if (failed) return NULL;
    return Py_BuildValue("nO", pos, done ? Py_True : Py_False);
}

/* -- tar header walk ------------------------------------------------------------ */

static inline int py_space(uint8_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* An octal field as the reference reads it (split at NUL, strip, octal digits):
 * 0 with *out set; -1 for anything else (base-256, signs, junk: the reference). */
static int octal(const uint8_t *p, size_t n, int empty_ok, uint64_t *out) {
    size_t end = 0;
    while (end < n && p[end] != 0) end++;
    size_t start = 0;
    while (start < end && py_space(p[start])) start++;
    while (end > start && py_space(p[end - 1])) end--;
    if (start == end && !empty_ok) return -1;
    uint64_t v = 0;
    for (size_t i = start; i < end; i++) {
        if (p[i] < '0' || p[i] > '7') return -1;
        if (v >> 60) return -1;
        v = v << 3 | (uint64_t)(p[i] - '0');
    }
    *out = v;
    return 0;
}

/* tar_headers.checksum_ok: the stored octal sum equals the unsigned or the signed
 * byte sum of the header with its checksum field as spaces */
static int tar_checksum_ok(const uint8_t *b) {
    uint64_t stored;
    if (octal(b + 148, 8, 0, &stored) < 0) return 0;
    int64_t uns = 256, sig = 256;
    for (int i = 0; i < 512; i++) {
        if (i >= 148 && i < 156) continue;
        uns += b[i];
        sig += (int8_t)b[i];
    }
    return (int64_t)stored == uns || (int64_t)stored == sig;
}

/* tar(buf, pos, limit, names, header_offsets, data_offsets, sizes, types) -> pos:
 * the plain headers of regular files, directories and other members without
 * data (types 0, NUL, 7, 1-6) from pos, at most limit of them; stops at the first
 * header it cannot settle (pax or GNU extended headers, sparse members, a bad
 * checksum or number, a name that is not UTF-8, data past the end of the buffer,
 * the end-of-archive zeros): the reference walk goes on from there. */
static PyObject *py_tar(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t pos, limit;
    PyObject *names, *hoffs, *doffs, *sizes, *types;
    if (!PyArg_ParseTuple(args, "y*nnO!O!O!O!O!", &view, &pos, &limit, &PyList_Type, &names,
                          &PyList_Type, &hoffs, &PyList_Type, &doffs, &PyList_Type, &sizes,
                          &PyList_Type, &types))
        return NULL;
    const uint8_t *buf = view.buf;
    Py_ssize_t size = view.len;
    int failed = 0;
    char joined[256];
    if (pos < 0) pos = 0;
    for (Py_ssize_t count = 0; count < limit; count++) {
        if (size - pos < 512) break;
        const uint8_t *b = buf + pos;
        uint8_t kind = b[156];
        int no_data = kind >= '1' && kind <= '6';
        if (!(kind == '0' || kind == 0 || kind == '7' || no_data)) break;
        if (!tar_checksum_ok(b)) break;
        uint64_t msize;
        if (octal(b + 124, 12, 1, &msize) < 0) break;
        size_t nlen = 0, plen = 0;
        while (nlen < 100 && b[nlen] != 0) nlen++;
        while (plen < 155 && b[345 + plen] != 0) plen++;
        Py_ssize_t data = pos + 512, span = 0;
        if (!no_data) {
            if (msize > (uint64_t)(size - data)) break;
            span = (Py_ssize_t)((msize + 511) / 512 * 512);
            if (span > size - data) break;
        }
        PyObject *name;
        if (plen) {
            if (!utf8_valid(b + 345, plen) || !utf8_valid(b, nlen)) break;
            memcpy(joined, b + 345, plen);
            joined[plen] = '/';
            memcpy(joined + plen + 1, b, nlen);
            name = PyUnicode_DecodeUTF8(joined, (Py_ssize_t)(plen + 1 + nlen), NULL);
        } else {
            if (!utf8_valid(b, nlen)) break;
            name = PyUnicode_DecodeUTF8((const char *)b, (Py_ssize_t)nlen, NULL);
        }
        if (append_new(names, name) < 0 || append_new(hoffs, PyLong_FromSsize_t(pos)) < 0 ||
            append_new(doffs, PyLong_FromSsize_t(data)) < 0 ||
            append_new(sizes, PyLong_FromUnsignedLongLong(msize)) < 0 ||
            append_new(types, PyBytes_FromStringAndSize((const char *)&kind, 1)) < 0) {
            failed = 1;
            break;
        }
        pos = data + span;
    }
    PyBuffer_Release(&view);
    if (failed) return NULL;
    return PyLong_FromSsize_t(pos);
}

/* crc32c(data) -> int: CRC32C of a buffer (unmasked): the check every read by a
 * reader compares with the catalog's (one call, no copy of the buffer). */
static PyObject *py_crc32c(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c;
    if (view.len > 4096) {
        Py_BEGIN_ALLOW_THREADS c = crc32c(view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        c = crc32c(view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

/* keyed_checks(checks, keys) -> list: each record's check XOR the CRC32C of its key's
 * UTF-8 (surrogateescape), kept as it is where the check or the key is None: what the
 * catalog stores (formats/checks.py), one call per shard. */
static PyObject *py_keyed_checks(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *checks_in, *keys_in;
    if (!PyArg_ParseTuple(args, "OO", &checks_in, &keys_in)) return NULL;
    PyObject *checks = PySequence_Fast(checks_in, "checks must be a sequence");
    PyObject *keys = checks == NULL ? NULL : PySequence_Fast(keys_in, "keys must be a sequence");
    PyObject *out = NULL;
    if (keys == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(checks);
    if (PySequence_Fast_GET_SIZE(keys) != n) {
        PyErr_SetString(PyExc_ValueError, "keyed_checks: as many keys as checks");
        goto done;
    }
    out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *check = PySequence_Fast_GET_ITEM(checks, i);
        PyObject *key = PySequence_Fast_GET_ITEM(keys, i), *value = NULL, *encoded = NULL;
        if (check == Py_None || key == Py_None) {
            value = Py_NewRef(check);
        } else if (PyUnicode_Check(key)) {
            Py_ssize_t len;
            const char *s = PyUnicode_AsUTF8AndSize(key, &len);
            if (s == NULL) { /* lone surrogates: as Python's surrogateescape encodes them */
                PyErr_Clear();
                encoded = PyUnicode_AsEncodedString(key, "utf-8", "surrogateescape");
                s = encoded == NULL ? NULL : PyBytes_AS_STRING(encoded);
                len = encoded == NULL ? 0 : PyBytes_GET_SIZE(encoded);
            }
            PyObject *mix = s == NULL ? NULL : PyLong_FromUnsignedLong(crc32c((const uint8_t *)s, (size_t)len));
            value = mix == NULL ? NULL : PyNumber_Xor(check, mix);
            Py_XDECREF(mix);
            Py_XDECREF(encoded);
        } else {
            PyErr_SetString(PyExc_TypeError, "keyed_checks: a key is a str or None");
        }
        if (value == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, value);
    }
done:
    Py_XDECREF(checks);
    Py_XDECREF(keys);
    return out;
}

static PyObject *py_masked_crc(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c = masked(view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *py_float32_shortest(PyObject *self, PyObject *args) {
    (void)self;
    double v;
    PyObject *fallback;
    if (!PyArg_ParseTuple(args, "dO", &v, &fallback)) return NULL;
    return f32_shortest((float)v, fallback);
}

static PyObject *py_hardware_crc(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
#ifdef HAVE_X86
    return PyBool_FromLong(crc32c == crc_hw);
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"tfrecord", py_tfrecord, METH_VARARGS, "Scan TFRecord frames of a buffer into columns."},
    {"recordio", py_recordio, METH_VARARGS, "Scan whole RecordIO frames of a buffer into columns."},
    {"tar", py_tar, METH_VARARGS, "Walk plain tar headers of a buffer into member columns."},
    {"crc32c", py_crc32c, METH_O, "CRC32C of a buffer: the check of every read."},
    {"keyed_checks", py_keyed_checks, METH_VARARGS,
     "keyed_checks(checks, keys): each check XOR the CRC32C of its key (None kept)."},
    {"masked_crc", py_masked_crc, METH_O, "TensorFlow's masked CRC32C of a buffer."},
    {"float32_shortest", py_float32_shortest, METH_VARARGS,
     "float32_shortest(x, fallback): the shortest decimal that rounds to float32(x)."},
    {"hardware_crc", py_hardware_crc, METH_NOARGS, "Whether CRC32C uses SSE4.2."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_scan", "The native TFRecord, RecordIO and tar scanners (see native.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__scan(void) {
    crc_setup();
    return PyModule_Create(&module);
}
