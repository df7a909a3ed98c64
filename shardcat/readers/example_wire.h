/* A tf.train.Example straight off its wire, for shardcat/readers/_hot.c: the first
 * value of one feature (get_feature) and the {feature: value} dict of Reader.to_dict,
 * of every feature or of a chosen few (RecordDataset items), without protobuf objects.
 *
 * Only what protobuf would decode the same way is settled here; anything else (a
 * repeated feature name or Features message, which protobuf merges; a map entry with
 * an unknown field, which upb keeps out of the map; a malformed wire) is 0 (AGAIN):
 * the caller then decodes the record with protobuf, whose answer or error is the
 * reference. Included once, by _hot.c (its functions are static, as wire.h's). */
#ifndef SHARDCAT_EXAMPLE_WIRE_H
#define SHARDCAT_EXAMPLE_WIRE_H

#include <Python.h>

#include "wire.h"

/* append a new reference to a list: 0, or -1 (with an error set) */
static int append_new(PyObject *list, PyObject *value) {
    if (value == NULL) return -1;
    int rc = PyList_Append(list, value);
    Py_DECREF(value);
    return rc;
}

/* The Features message of an Example: 1 and [*fs, *fe) (NULL: none), or 0 (AGAIN). */
static int example_features(const uint8_t *p, const uint8_t *end, const uint8_t **fs,
                            const uint8_t **fe) {
    uint32_t field;
    int wt;
    *fs = *fe = NULL;
    while (p < end) { /* Example: features = 1 (twice: protobuf would merge them) */
        if (tag(&p, end, &field, &wt)) return 0;
        if (field == 1) {
            if (wt != 2 || *fs != NULL || delimited(&p, end, fs, fe)) return 0;
        } else if (skip(&p, end, wt)) return 0;
    }
    return 1;
}

/* The next map entry of a Features message at *pp: 1 with its key [*k, *ke) and value
 * [*v, *ve), 2 at the end, 0 (AGAIN: a malformed or odd entry). */
static int next_entry(const uint8_t **pp, const uint8_t *fe, const uint8_t **k,
                      const uint8_t **ke, const uint8_t **v, const uint8_t **ve) {
    uint32_t field;
    int wt;
    const uint8_t *a, *b;
    for (;;) {
        if (*pp == NULL || *pp >= fe) return 2;
        if (tag(pp, fe, &field, &wt)) return 0;
        if (field == 1) break;
        if (skip(pp, fe, wt)) return 0;
    }
    if (wt != 2 || delimited(pp, fe, &a, &b)) return 0;
    *k = *v = NULL;
    while (a < b) { /* entry: key = 1, value = 2; nothing else (upb keeps such an entry
                       * out of the map, among the unknown fields: AGAIN) */
        if (tag(&a, b, &field, &wt) || (field != 1 && field != 2) || wt != 2) return 0;
        if (field == 1) {
            if (*k != NULL || delimited(&a, b, k, ke)) return 0;
        } else if (*v != NULL || delimited(&a, b, v, ve)) return 0;
    }
    return *k != NULL && *v != NULL; /* a missing key or value: AGAIN */
}

/* The one list of a Feature: 1 with its kind (0 none, 1 bytes, 2 float, 3 int64) and
 * [*ls, *le), or 0 (AGAIN). */
static int feature_list(const uint8_t *p, const uint8_t *end, int *kind, const uint8_t **ls,
                        const uint8_t **le) {
    uint32_t field;
    int wt;
    *kind = 0;
    *ls = *le = NULL;
    while (p < end) { /* Feature: one of bytes_list 1, float_list 2, int64_list 3 */
        if (tag(&p, end, &field, &wt)) return 0;
        if (field >= 1 && field <= 3) {
            if (wt != 2 || *kind != 0 || delimited(&p, end, ls, le)) return 0;
            *kind = (int)field;
        } else if (skip(&p, end, wt)) return 0;
    }
    return 1;
}

/* Append a new value to `out` unless `out` is NULL (a list only checked): 1, or 0
 * (an error set). */
static int add_value(PyObject *out, PyObject *value) {
    return out == NULL || append_new(out, value) == 0;
}

/* Append the values of a list of `kind` to `out` (at most `most`; `out` NULL: only
 * check the list's wire, every value): 1, or 0 (AGAIN; an error may be set). */
static int list_values(const uint8_t *p, const uint8_t *le, int kind, Py_ssize_t most,
                       PyObject *out) {
    uint32_t field;
    int wt;
    const uint8_t *a, *b;
    uint64_t iv;
#define ROOM (out == NULL || PyList_GET_SIZE(out) < most)
    while (p != NULL && p < le && ROOM) { /* the list: value = 1 */
        if (tag(&p, le, &field, &wt)) return 0;
        if (field != 1) {
            if (skip(&p, le, wt)) return 0;
            continue;
        }
        if (kind == 1 && wt == 2) {
            if (delimited(&p, le, &a, &b)) return 0;
            if (out != NULL && !add_value(out, PyBytes_FromStringAndSize((const char *)a, b - a)))
                return 0;
        } else if (kind == 2 && (wt == 2 || wt == 5)) {
            if (wt == 2) {
                if (delimited(&p, le, &a, &b) || (b - a) % 4) return 0;
            } else {
                if (le - p < 4) return 0;
                a = p, p += 4, b = p;
            }
            for (; out != NULL && a < b && ROOM; a += 4) {
                float f;
                memcpy(&f, a, 4); /* little-endian, as the wire */
                if (!add_value(out, PyFloat_FromDouble((double)f))) return 0;
            }
        } else if (kind == 3 && (wt == 2 || wt == 0)) {
            if (wt == 0) {
                a = p;
                if (varint(&p, le, &iv)) return 0;
                b = p;
            } else if (delimited(&p, le, &a, &b)) {
                return 0;
            }
            while (a < b && ROOM) {
                if (varint(&a, b, &iv)) return 0;
                if (out != NULL && !add_value(out, PyLong_FromLongLong((long long)(int64_t)iv)))
                    return 0;
            }
        } else {
            return 0;
        }
    }
#undef ROOM
    return 1;
}

/* The first value of feature `name` of an Example: 1 and *out (None for a missing
 * or empty feature), or 0 (AGAIN: what protobuf would merge, or a malformed wire). */
static int first_value(const uint8_t *p, const uint8_t *end, const char *name, size_t nlen,
                       PyObject **out) {
    const uint8_t *fs, *fe, *k, *ke, *v, *ve, *vs = NULL, *vend = NULL, *ls, *le;
    int got, kind;
    if (!example_features(p, end, &fs, &fe)) return 0;
    for (p = fs; (got = next_entry(&p, fe, &k, &ke, &v, &ve)) == 1;) {
        if ((size_t)(ke - k) == nlen && memcmp(k, name, nlen) == 0) {
            if (vs != NULL) return 0; /* a repeated key */
            vs = v, vend = ve;
        }
    }
    if (got == 0) return 0;
    if (vs == NULL) {
        *out = Py_NewRef(Py_None);
        return 1;
    }
    if (!feature_list(vs, vend, &kind, &ls, &le)) return 0;
    PyObject *values = PyList_New(0);
    if (values == NULL || !list_values(ls, le, kind, 1, values)) {
        Py_XDECREF(values);
        return 0;
    }
    *out = Py_NewRef(PyList_GET_SIZE(values) ? PyList_GET_ITEM(values, 0) : Py_None);
    Py_DECREF(values);
    return 1;
}

/* Whether [k, ke) is UTF-8 (protobuf refuses a map key that is not): 1, or 0. */
static int utf8(const uint8_t *k, const uint8_t *ke) {
    const uint8_t *a = k;
    while (a < ke && *a < 0x80) a++;
    if (a == ke) return 1;
    PyObject *name = PyUnicode_DecodeUTF8((const char *)k, ke - k, NULL);
    Py_XDECREF(name);
    return name != NULL;
}

/* The feature name [k, ke) as a str (a new reference; NULL: not UTF-8, an error set).
 * The names met last are kept (records of a dataset share them): the dicts of a batch
 * then share their key objects, whose hashes are computed once and which pickle as
 * one (a DataLoader worker's batch). Used with the GIL held. */
#define NAMES_KEPT 32
static PyObject *names_kept[NAMES_KEPT];
static unsigned names_next;

static PyObject *feature_name(const uint8_t *k, const uint8_t *ke) {
    Py_ssize_t n = ke - k, have;
    for (unsigned i = 0; i < NAMES_KEPT && names_kept[i] != NULL; i++) {
        const char *name = PyUnicode_AsUTF8AndSize(names_kept[i], &have);
        if (name != NULL && have == n && memcmp(name, k, (size_t)n) == 0)
            return Py_NewRef(names_kept[i]);
    }
    PyObject *name = PyUnicode_DecodeUTF8((const char *)k, n, NULL);
    if (name != NULL && n <= 256) {
        unsigned at = names_next++ % NAMES_KEPT;
        Py_XSETREF(names_kept[at], Py_NewRef(name));
    }
    return name;
}

/* Whether the entry key [k, ke) is one of `select` (a tuple of str; NULL: all). */
static int chosen(const uint8_t *k, const uint8_t *ke, PyObject *select) {
    if (select == NULL) return 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(select); i++) {
        Py_ssize_t n;
        const char *name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(select, i), &n);
        if (name == NULL) {
            PyErr_Clear();
            continue;
        }
        if (n == ke - k && memcmp(name, k, (size_t)n) == 0) return 1;
    }
    return 0;
}

/* The {feature: value} dict of an Example (single values unwrapped, lists otherwise:
 * Reader.to_dict of the decoded Example), of the features in `select` only (a tuple
 * of str; NULL: all; the others' wire checked all the same): 1 and *out, or 0 (AGAIN;
 * an error may be set). */
static int example_items(const uint8_t *p, const uint8_t *end, PyObject *select,
                         PyObject **out) {
    const uint8_t *fs, *fe, *k, *ke, *v, *ve, *ls, *le;
    int got = 0, kind;
    PyObject *dict = PyDict_New();
    if (dict != NULL && example_features(p, end, &fs, &fe)) {
        for (p = fs; (got = next_entry(&p, fe, &k, &ke, &v, &ve)) == 1;) {
            if (!chosen(k, ke, select)) { /* its wire checked, no objects */
                if (!utf8(k, ke) || !feature_list(v, ve, &kind, &ls, &le) ||
                    !list_values(ls, le, kind, PY_SSIZE_T_MAX, NULL))
                    got = 0;
                if (got == 0) break;
                continue;
            }
            PyObject *name = feature_name(k, ke);
            PyObject *values = name == NULL ? NULL : PyList_New(0);
            int ok = values != NULL && !PyDict_Contains(dict, name) &&
                     feature_list(v, ve, &kind, &ls, &le) &&
                     list_values(ls, le, kind, PY_SSIZE_T_MAX, values) &&
                     PyDict_SetItem(dict, name, PyList_GET_SIZE(values) == 1
                                                    ? PyList_GET_ITEM(values, 0)
                                                    : values) == 0;
            Py_XDECREF(name);
            Py_XDECREF(values);
            if (!ok) {
                got = 0;
                break;
            }
        }
    }
    if (got != 2) { /* odd, malformed or a failed allocation */
        Py_XDECREF(dict);
        return 0;
    }
    *out = dict;
    return 1;
}

#endif
