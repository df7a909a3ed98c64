/* The native single read by key of a TFRecord dataset (shardcat/readers/hot.py):
 * the key lookup through a statement prepared once on the reader thread's own
 * sqlite3 connection (the SQLite library Python's sqlite3 module uses, so the
 * lookup runs in the same read snapshot as every other query of the call), the
 * pread of the payload, the file check after it (fstat against what the source
 * last saw), the end-to-end check (CRC32C of the payload XOR CRC32C of the key
 * against the catalog's crc) and, for get_feature, the first value of one
 * feature straight off the Example's wire.
 *
 * It settles the common, correct case only. Anything else (no source open yet
 * for the shard, a source that is not a plain file, a short read, a file that
 * changed, a check that fails, a row without a check, a row of the wrong types,
 * an unusual or malformed Example, a closed connection, any SQLite error) is
 * AGAIN: the Python path then does the whole read itself, so its errors and odd
 * cases are the reference's by construction.
 *
 * Python API:
 *   Lookup(conn, sql, file_source_type): `sql` prepared on `conn` (a
 *       sqlite3.Connection); rows are (shard_id, offset, length, crc).
 *   get(lookup, key, sources, feature, verify) -> MISS (no such key), AGAIN,
 *       the payload (feature None) or the feature's first value (None when the
 *       feature is missing or empty).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wire.h"

#define TFRECORD_HEADER 12

/* append a new reference to a list: 0, or -1 (with an error set) */
static int append_new(PyObject *list, PyObject *value) {
    if (value == NULL) return -1;
    int rc = PyList_Append(list, value);
    Py_DECREF(value);
    return rc;
}

/* The head of CPython's sqlite3.Connection (3.8 to 3.13): the sqlite3 * follows
 * PyObject_HEAD. hot.py uses this module only where that holds and the library
 * versions agree; Lookup() also checks the handle names the connection's file. */
typedef struct {
    PyObject_HEAD sqlite3 *db;
} ConnHead;

typedef struct {
    PyObject_HEAD PyObject *conn;
    PyObject *file_type;
    sqlite3 *db;
    sqlite3_stmt *stmt;
    pid_t pid;
} Lookup;

static PyObject *MISS, *AGAIN, *s_fd, *s_seen, *connection_type;

static void lookup_dealloc(Lookup *self) {
    /* a forked child never touches its parent's statement (it leaks its copy) */
    if (self->stmt != NULL && self->pid == getpid()) sqlite3_finalize(self->stmt);
    Py_XDECREF(self->conn);
    Py_XDECREF(self->file_type);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *lookup_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *conn, *file_type;
    const char *sql, *filename;
    if (!PyArg_ParseTuple(args, "OsOs", &conn, &sql, &file_type, &filename)) return NULL;
    int is_conn = PyObject_IsInstance(conn, connection_type);
    if (is_conn <= 0) {
        if (is_conn == 0) PyErr_SetString(PyExc_ValueError, "not a sqlite3 connection");
        return NULL;
    }
    sqlite3 *db = ((ConnHead *)conn)->db;
    const char *own = db == NULL ? NULL : sqlite3_db_filename(db, "main");
    if (own == NULL || strcmp(own, filename) != 0) {
        PyErr_SetString(PyExc_ValueError, "not the sqlite3 connection of that file");
        return NULL;
    }
    sqlite3_stmt *stmt = NULL;
    if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, NULL) != SQLITE_OK) {
        PyErr_Format(PyExc_ValueError, "cannot prepare: %s", sqlite3_errmsg(db));
        return NULL;
    }
    Lookup *self = (Lookup *)type->tp_alloc(type, 0);
    if (self == NULL) {
        sqlite3_finalize(stmt);
        return NULL;
    }
    self->conn = Py_NewRef(conn);
    self->file_type = Py_NewRef(file_type);
    self->db = db;
    self->stmt = stmt;
    self->pid = getpid();
    return (PyObject *)self;
}

static PyTypeObject LookupType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardcat.readers._hot.Lookup",
    .tp_basicsize = sizeof(Lookup),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = lookup_new,
    .tp_dealloc = (destructor)lookup_dealloc,
    .tp_doc = "A record lookup prepared on one sqlite3 connection.",
};

typedef struct {
    int64_t shard_id, offset, length, crc;
    int has_crc;
} Row;

/* The row of `key` (1), none (0) or AGAIN (-1). */
static int find(Lookup *lk, const char *key, Py_ssize_t klen, Row *row) {
    sqlite3_stmt *st = lk->stmt;
    if (((ConnHead *)lk->conn)->db != lk->db || lk->pid != getpid()) return -1;
    if (sqlite3_bind_text(st, 1, key, (int)klen, SQLITE_STATIC) != SQLITE_OK) return -1;
    int rc = sqlite3_step(st), found = -1;
    if (rc == SQLITE_DONE) {
        found = 0;
    } else if (rc == SQLITE_ROW && sqlite3_column_type(st, 0) == SQLITE_INTEGER &&
               sqlite3_column_type(st, 1) == SQLITE_INTEGER &&
               sqlite3_column_type(st, 2) == SQLITE_INTEGER) {
        row->shard_id = sqlite3_column_int64(st, 0);
        row->offset = sqlite3_column_int64(st, 1);
        row->length = sqlite3_column_int64(st, 2);
        row->has_crc = sqlite3_column_type(st, 3) == SQLITE_INTEGER;
        row->crc = row->has_crc ? sqlite3_column_int64(st, 3) : 0;
        found = sqlite3_step(st) == SQLITE_DONE ? 1 : -1; /* one row: a unique key */
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return found;
}

/* Whether `seen` (None, or the source's (mtime_ns, ctime_ns, size)) still holds. */
static int unchanged(int fd, PyObject *seen) {
    if (seen == Py_None) return 1;
    struct stat st;
    if (!PyTuple_Check(seen) || PyTuple_GET_SIZE(seen) != 3 || fstat(fd, &st) != 0) return 0;
    long long now[3] = {(long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
                        (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec,
                        (long long)st.st_size};
    for (int i = 0; i < 3; i++) {
        int overflow = 0;
        long long want = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(seen, i), &overflow);
        if (want == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (overflow || want != now[i]) return 0;
    }
    return 1;
}

/* The descriptor of shard `id`'s source in `sources` when it is a plain file source
 * (else -1, no error set); *source: the source (borrowed). */
static int file_fd(PyObject *file_type, PyObject *sources, int64_t id, PyObject **source) {
    PyObject *key = PyLong_FromLongLong(id);
    if (key == NULL) goto error;
    *source = PyDict_GetItemWithError(sources, key); /* borrowed */
    Py_DECREF(key);
    if (*source == NULL || (PyObject *)Py_TYPE(*source) != file_type) goto error;
    PyObject *fdobj = PyObject_GetAttr(*source, s_fd);
    if (fdobj == NULL) goto error;
    long fd = PyLong_AsLong(fdobj);
    Py_DECREF(fdobj);
    if (fd < 0 || fd > 0x7FFFFFFF) goto error;
    return (int)fd;
error:
    PyErr_Clear();
    return -1;
}

/* A TFRecord payload of `length` bytes at frame `offset` of `fd` (NULL: AGAIN, no
 * error set). */
static PyObject *pread_payload(int fd, int64_t offset, int64_t length) {
    if (offset < 0 || length < 0 || length > 0x7FFFFFFF) return NULL;
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
    if (data == NULL) {
        PyErr_Clear();
        return NULL;
    }
    char *buf = PyBytes_AS_STRING(data);
    size_t done = 0, want = (size_t)length;
    off_t at = (off_t)(offset + TFRECORD_HEADER);
    ssize_t n = 1;
    Py_BEGIN_ALLOW_THREADS while (done < want) {
        n = pread(fd, buf + done, want - done, at + (off_t)done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += (size_t)n;
    }
    Py_END_ALLOW_THREADS if (done != want) {
        Py_DECREF(data);
        return NULL;
    }
    return data;
}

/* The payload of `row` read from its plain file source, the file checked after it
 * (NULL: AGAIN, no error set). */
static PyObject *payload(Lookup *lk, PyObject *sources, const Row *row) {
    PyObject *source;
    int fd = file_fd(lk->file_type, sources, row->shard_id, &source);
    PyObject *data = fd < 0 ? NULL : pread_payload(fd, row->offset, row->length);
    if (data == NULL) return NULL;
    PyObject *seen = PyObject_GetAttr(source, s_seen);
    int same = seen != NULL && unchanged(fd, seen);
    Py_XDECREF(seen);
    if (!same) {
        PyErr_Clear();
        Py_DECREF(data);
        return NULL;
    }
    return data;
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

/* Append the values of a list of `kind` to `out` (at most `most`): 1, or 0 (AGAIN;
 * an error may be set). */
static int list_values(const uint8_t *p, const uint8_t *le, int kind, Py_ssize_t most,
                       PyObject *out) {
    uint32_t field;
    int wt;
    const uint8_t *a, *b;
    uint64_t iv;
    while (p != NULL && p < le && PyList_GET_SIZE(out) < most) { /* the list: value = 1 */
        if (tag(&p, le, &field, &wt)) return 0;
        if (field != 1) {
            if (skip(&p, le, wt)) return 0;
            continue;
        }
        PyObject *value = NULL;
        if (kind == 1 && wt == 2) {
            if (delimited(&p, le, &a, &b)) return 0;
            value = PyBytes_FromStringAndSize((const char *)a, b - a);
        } else if (kind == 2 && (wt == 2 || wt == 5)) {
            if (wt == 2) {
                if (delimited(&p, le, &a, &b) || (b - a) % 4) return 0;
            } else {
                if (le - p < 4) return 0;
                a = p, p += 4, b = p;
            }
            for (; a < b && PyList_GET_SIZE(out) < most; a += 4) {
                float f;
                memcpy(&f, a, 4); /* little-endian, as the wire */
                if (append_new(out, PyFloat_FromDouble((double)f))) return 0;
            }
            continue;
        } else if (kind == 3 && (wt == 2 || wt == 0)) {
            if (wt == 2) {
                if (delimited(&p, le, &a, &b)) return 0;
                while (a < b && PyList_GET_SIZE(out) < most) {
                    if (varint(&a, b, &iv)) return 0;
                    if (append_new(out, PyLong_FromLongLong((long long)(int64_t)iv))) return 0;
                }
                continue;
            }
            if (varint(&p, le, &iv)) return 0;
            value = PyLong_FromLongLong((long long)(int64_t)iv);
        } else {
            return 0;
        }
        if (append_new(out, value)) return 0;
    }
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

/* example_dict(payload) -> {feature: value} (single values unwrapped, lists otherwise:
 * Reader.to_dict of the decoded Example), or AGAIN. */
static PyObject *py_example_dict(PyObject *module, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = view.buf, *end = p + view.len, *fs, *fe, *k, *ke, *v, *ve, *ls, *le;
    int got = 0, kind;
    PyObject *out = PyDict_New();
    if (out != NULL && example_features(p, end, &fs, &fe)) {
        for (p = fs; (got = next_entry(&p, fe, &k, &ke, &v, &ve)) == 1;) {
            PyObject *name = PyUnicode_DecodeUTF8((const char *)k, ke - k, NULL);
            PyObject *values = name == NULL ? NULL : PyList_New(0);
            int ok = values != NULL && !PyDict_Contains(out, name) &&
                     feature_list(v, ve, &kind, &ls, &le) &&
                     list_values(ls, le, kind, PY_SSIZE_T_MAX, values) &&
                     PyDict_SetItem(out, name, PyList_GET_SIZE(values) == 1
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
    PyBuffer_Release(&view);
    if (out == NULL) return NULL;
    if (got != 2) { /* odd, malformed or a failed allocation: the Python path */
        PyErr_Clear();
        Py_DECREF(out);
        return Py_NewRef(AGAIN);
    }
    return out;
}

/* One checked payload of a batch row (a new reference; NULL: AGAIN, no error set). */
static PyObject *row_payload(PyObject *row, Py_ssize_t at, int fd, int verify, PyObject *key) {
    int64_t offset = PyLong_AsLongLong(PyTuple_GET_ITEM(row, at));
    int64_t length = PyLong_AsLongLong(PyTuple_GET_ITEM(row, at + 1));
    PyObject *crcobj = PyTuple_GET_ITEM(row, at + 2);
    long long crc = crcobj == Py_None ? -1 : PyLong_AsLongLong(crcobj);
    if (PyErr_Occurred() || (verify && (crc < 0 || crc > 0xFFFFFFFFLL))) return NULL;
    PyObject *data = pread_payload(fd, offset, length);
    if (data == NULL || !verify) return data;
    uint32_t got = crc32c((const uint8_t *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
    if (key != NULL) {
        Py_ssize_t klen;
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, &klen) : NULL;
        if (k == NULL) {
            Py_DECREF(data);
            return NULL;
        }
        got ^= crc32c((const uint8_t *)k, (size_t)klen);
    }
    if (got != (uint32_t)crc) {
        Py_DECREF(data);
        return NULL; /* the Python path names the mismatch */
    }
    return data;
}

/* read_rows(rows, at, sources, file_type, verify, keyed, names) -> the payloads in
 * batch order (row[0] is a row's place), or AGAIN. Rows are those of Reader._load, in
 * file order; no file check here (the caller checks each shard once at the end). */
static PyObject *py_read_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyList_Check(args[0]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "read_rows(rows: list, at, sources: dict, file_type, verify, keyed, names)");
        return NULL;
    }
    PyObject *rows = args[0], *names = args[6];
    Py_ssize_t at = PyLong_AsSsize_t(args[1]), n = PyList_GET_SIZE(rows);
    int verify = PyObject_IsTrue(args[4]), keyed = PyObject_IsTrue(args[5]), fd = -1;
    if (at < 1 || verify < 0 || keyed < 0) return NULL;
    PyObject *out = PyList_New(n), *source;
    if (out == NULL) return NULL;
    int64_t shard = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i), *key = NULL, *data;
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) < at + 3) goto again;
        Py_ssize_t place = PyLong_AsSsize_t(PyTuple_GET_ITEM(row, 0));
        int64_t id = PyLong_AsLongLong(PyTuple_GET_ITEM(row, 1));
        if (PyErr_Occurred() || place < 0 || place >= n || PyList_GET_ITEM(out, place) != NULL)
            goto again;
        if (id != shard || fd < 0) {
            fd = file_fd(args[3], args[2], id, &source);
            shard = id;
            if (fd < 0) goto again;
        }
        if (keyed) {
            key = names == Py_None ? PyTuple_GET_ITEM(row, PyTuple_GET_SIZE(row) - 1)
                                   : PySequence_GetItem(names, place);
            if (key == NULL) goto again;
        }
        data = row_payload(row, at, fd, verify, key);
        if (keyed && names != Py_None) Py_DECREF(key);
        if (data == NULL) goto again;
        PyList_SET_ITEM(out, place, data);
    }
    return out;
again:
    PyErr_Clear();
    Py_DECREF(out);
    return Py_NewRef(AGAIN);
}

static PyObject *py_get(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyObject_TypeCheck(args[0], &LookupType) || !PyUnicode_Check(args[1]) ||
        !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "get(lookup, key: str, sources: dict, feature, verify)");
        return NULL;
    }
    Lookup *lk = (Lookup *)args[0];
    Py_ssize_t klen;
    const char *key = PyUnicode_AsUTF8AndSize(args[1], &klen);
    if (key == NULL) { /* a key with surrogates: the Python path encodes it */
        PyErr_Clear();
        return Py_NewRef(AGAIN);
    }
    Row row;
    int found = find(lk, key, klen, &row);
    if (found <= 0) return Py_NewRef(found == 0 ? MISS : AGAIN);
    int verify = PyObject_IsTrue(args[4]);
    if (verify < 0 || (verify && !row.has_crc)) { /* no check stored: framing, in Python */
        PyErr_Clear();
        return Py_NewRef(AGAIN);
    }
    PyObject *data = payload(lk, args[2], &row);
    if (data == NULL) return Py_NewRef(AGAIN);
    const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(data);
    size_t n = (size_t)PyBytes_GET_SIZE(data);
    if (verify && (crc32c(p, n) ^ crc32c((const uint8_t *)key, (size_t)klen)) !=
                      (uint32_t)row.crc) {
        Py_DECREF(data);
        return Py_NewRef(AGAIN); /* the Python path names the mismatch */
    }
    if (args[3] == Py_None) return data;
    Py_ssize_t nlen;
    const char *name = PyUnicode_Check(args[3]) ? PyUnicode_AsUTF8AndSize(args[3], &nlen) : NULL;
    PyObject *value = NULL;
    int settled = name != NULL && first_value(p, p + n, name, (size_t)nlen, &value);
    Py_DECREF(data);
    if (!settled) {
        PyErr_Clear();
        Py_XDECREF(value);
        return Py_NewRef(AGAIN);
    }
    return value;
}

static PyMethodDef methods[] = {
    {"get", (PyCFunction)(void (*)(void))py_get, METH_FASTCALL,
     "get(lookup, key, sources, feature, verify): one checked read by key."},
    {"read_rows", (PyCFunction)(void (*)(void))py_read_rows, METH_FASTCALL,
     "read_rows(rows, at, sources, file_type, verify, keyed, names): a batch's payloads."},
    {"example_dict", py_example_dict, METH_O,
     "example_dict(payload): {feature: value} of an Example, or AGAIN."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hot", "The native single read by key (see hot.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__hot(void) {
    crc_setup();
    if (PyType_Ready(&LookupType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    MISS = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    AGAIN = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    s_fd = PyUnicode_InternFromString("fd");
    s_seen = PyUnicode_InternFromString("_seen");
    PyObject *sqlite3_module = PyImport_ImportModule("sqlite3");
    if (sqlite3_module == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    connection_type = PyObject_GetAttrString(sqlite3_module, "Connection");
    Py_DECREF(sqlite3_module);
    if (MISS == NULL || AGAIN == NULL || s_fd == NULL || s_seen == NULL || connection_type == NULL ||
        PyModule_AddObjectRef(m, "MISS", MISS) < 0 ||
        PyModule_AddObjectRef(m, "AGAIN", AGAIN) < 0 ||
        PyModule_AddObjectRef(m, "Lookup", (PyObject *)&LookupType) < 0 ||
        PyModule_AddIntConstant(m, "sqlite_version", sqlite3_libversion_number()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
