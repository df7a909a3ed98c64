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
#include <Python.h> /* (first: it defines _GNU_SOURCE, which preadv2 needs) */
#include <errno.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "example_dict.h"

#define TFRECORD_HEADER 12

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
    uint32_t keycrc; /* what the row's key mixes into the check (0: none) */
} Row;

/* The row of the bound lookup (1), none (0) or AGAIN (-1), the statement reset after; `key_column` >= 0: the
 * column of the row's key, whose CRC32C goes to row->keycrc. */
static int find_row(Lookup *lk, Row *row, int key_column) {
    sqlite3_stmt *st = lk->stmt;
    int rc = sqlite3_step(st), found = -1;
    if (rc == SQLITE_DONE) {
        found = 0;
    } else if (rc == SQLITE_ROW && sqlite3_column_type(st, 0) == SQLITE_INTEGER &&
               sqlite3_column_type(st, 1) == SQLITE_INTEGER &&
               sqlite3_column_type(st, 2) == SQLITE_INTEGER &&
               (key_column < 0 || sqlite3_column_type(st, key_column) == SQLITE_TEXT)) {
        row->shard_id = sqlite3_column_int64(st, 0);
        row->offset = sqlite3_column_int64(st, 1);
        row->length = sqlite3_column_int64(st, 2);
        row->has_crc = sqlite3_column_type(st, 3) == SQLITE_INTEGER;
        row->crc = row->has_crc ? sqlite3_column_int64(st, 3) : 0;
        if (key_column >= 0) {
            const uint8_t *key = sqlite3_column_text(st, key_column);
            int klen = sqlite3_column_bytes(st, key_column);
            row->keycrc = key == NULL ? 0 : crc32c(key, (size_t)klen);
            if (key == NULL) row->has_crc = 0;
        }
        found = sqlite3_step(st) == SQLITE_DONE ? 1 : -1; /* one row: a unique key */
    }
    sqlite3_reset(st);
    return found;
}

/* The row of `key` (1), none (0) or AGAIN (-1). */
static int find(Lookup *lk, const char *key, Py_ssize_t klen, Row *row) {
    if (((ConnHead *)lk->conn)->db != lk->db || lk->pid != getpid()) return -1;
    int found = sqlite3_bind_text(lk->stmt, 1, key, (int)klen, SQLITE_STATIC) != SQLITE_OK
                    ? -1
                    : find_row(lk, row, -1);
    sqlite3_clear_bindings(lk->stmt);
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
#ifdef RWF_NOWAIT
    /* from the page cache without letting go of the GIL (that costs more than the copy);
     * what the kernel would have to wait for is read below, the GIL released */
    struct iovec cached = {buf, want};
    n = preadv2(fd, &cached, 1, at, RWF_NOWAIT);
    if (n > 0) done = (size_t)n;
    n = 1;
#endif
    if (done < want) {
        Py_BEGIN_ALLOW_THREADS while (done < want) {
            n = pread(fd, buf + done, want - done, at + (off_t)done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            done += (size_t)n;
        }
        Py_END_ALLOW_THREADS
    }
    if (done != want) {
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

/* example_dict(payload[, select]) -> {feature: value} (single values unwrapped, lists
 * otherwise: Reader.to_dict of the decoded Example; of the features in `select`, a
 * tuple of str, only), or AGAIN. */
static PyObject *py_example_dict(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *select = nargs == 2 && args[1] != Py_None ? args[1] : NULL, *out = NULL;
    if (nargs < 1 || nargs > 2 || (select != NULL && !PyTuple_Check(select))) {
        PyErr_SetString(PyExc_TypeError, "example_dict(payload, select: tuple | None = None)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = view.buf;
    int settled = example_items(p, p + view.len, select, &out);
    PyBuffer_Release(&view);
    if (!settled) { /* odd, malformed or a failed allocation: the Python path */
        PyErr_Clear();
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

#include "hot_batch.h"

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
    {"read_batch", (PyCFunction)(void (*)(void))py_read_batch, METH_FASTCALL,
     "read_batch(lookup, items, layout, sources, verify, keyed, dicts, select): a batch."},
    {"example_dict", (PyCFunction)(void (*)(void))py_example_dict, METH_FASTCALL,
     "example_dict(payload, select=None): {feature: value} of an Example, or AGAIN."},
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
