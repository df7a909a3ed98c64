/* The native batch read of a TFRecord dataset (shardcat/readers/batch.py), for
 * shardcat/readers/_hot.c, which includes it after the Lookup type, find_row(),
 * file_fd() and unchanged(): a whole batch of keys or positions looked up, read and
 * checked in one call, and its items built straight off the wire.
 *
 *   read_batch(lookup, items, layout, sources, verify, keyed, dicts, select)
 *
 * `lookup` is prepared on the calling thread's own sqlite3 connection, as the single
 * read's: by key (`items` are str; `layout` None) or by (shard_id, ordinal) (`items`
 * are positions; `layout` is (starts, ids, count, skip): int64 buffers of each
 * shard's first stored position and id, in position order, the number of positions,
 * and DatasetView._skip, which maps a position past soft-deleted records). Rows are
 * (shard_id, offset, length, crc[, key]). The lookups run in sorted order (B-tree
 * locality), the reads in (shard, offset) order with the GIL released, frames within
 * GAP bytes of each other read in one pread; every payload is checked against the
 * catalog's crc (mixed, with `keyed`, with the key asked for, or for positions the
 * row's), each shard's file checked once after its reads. Returns, in batch order,
 * the payloads (`dicts` false) or their {feature: value} dicts (of the features in
 * `select`, a tuple of str, or all: None), an item the wire cannot settle being
 * AGAIN; or AGAIN for the whole batch (a missing key or row, a bad position, a row of
 * the wrong types, a failed check, a changed file, anything unsure: the Python path
 * then reads the batch and its errors are the reference's); or a tuple holding the
 * list of the ids of shards without an open plain file source (open them, call
 * again). */
#ifndef SHARDCAT_HOT_BATCH_H
#define SHARDCAT_HOT_BATCH_H

#include <stdlib.h>

#define GAP 512 /* bytes between two payloads still read in one pread (frames: 16) */
#define BATCH_MOST (1LL << 30) /* a batch's bytes read natively at most */

typedef struct { /* one item of a batch (the batch's w[i] is item i) */
    const char *key;    /* by key: its UTF-8 (the str's own) */
    Py_ssize_t klen;
    int64_t ordinal;    /* by position */
    Row row;
    int fd;
    int64_t at;         /* where its payload is in the batch's buffer */
    int joined;         /* read in one pread with the record before it */
} Want;

/* The buffer of the last batch, kept for the next one (a fresh one costs a page fault
 * per 4 KiB read): taken and given back with the GIL held, so a batch in another
 * thread meanwhile (reading with the GIL released) allocates its own. */
#define SPARE_MOST (64LL << 20)
static char *spare;
static size_t spare_size;

/* A buffer of at least `size` bytes (NULL: no memory); *capacity: its size. */
static char *take_buffer(size_t size, size_t *capacity) {
    char *buf = NULL;
    if (spare != NULL && spare_size >= size) {
        buf = spare, *capacity = spare_size;
        spare = NULL, spare_size = 0;
        return buf;
    }
    *capacity = size ? size : 1;
    return PyMem_Malloc(*capacity);
}

/* Keep `buf` (of `capacity` bytes) as the spare when it is larger than the spare. */
static void give_back(char *buf, size_t capacity) {
    if (buf == NULL) return;
    if ((spare != NULL && spare_size >= capacity) || (long long)capacity > SPARE_MOST) {
        PyMem_Free(buf);
        return;
    }
    PyMem_Free(spare);
    spare = buf, spare_size = capacity;
}

/* orders of Want pointers */
static int by_key_order(const void *a, const void *b) {
    const Want *x = *(Want *const *)a, *y = *(Want *const *)b;
    Py_ssize_t n = x->klen < y->klen ? x->klen : y->klen;
    int c = memcmp(x->key, y->key, (size_t)n);
    return c ? c : (x->klen > y->klen) - (x->klen < y->klen);
}

static int by_place_in_table(const void *a, const void *b) {
    const Want *x = *(Want *const *)a, *y = *(Want *const *)b;
    if (x->row.shard_id != y->row.shard_id) return x->row.shard_id < y->row.shard_id ? -1 : 1;
    return (x->ordinal > y->ordinal) - (x->ordinal < y->ordinal);
}

static int by_place_in_file(const void *a, const void *b) {
    const Want *x = *(Want *const *)a, *y = *(Want *const *)b;
    if (x->row.shard_id != y->row.shard_id) return x->row.shard_id < y->row.shard_id ? -1 : 1;
    return (x->row.offset > y->row.offset) - (x->row.offset < y->row.offset);
}

/* Where each item is: its key, or its (shard, ordinal) from `layout`: 1, or 0 (AGAIN). */
static int place_items(Want *w, PyObject *items, PyObject *layout) {
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (layout == Py_None) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *key = PyList_GET_ITEM(items, i);
            w[i].key = PyUnicode_CheckExact(key) ? PyUnicode_AsUTF8AndSize(key, &w[i].klen) : NULL;
            if (w[i].key == NULL) return 0; /* surrogates: the Python path encodes them */
        }
        return 1;
    }
    Py_buffer starts, ids, skip;
    long long count;
    if (!PyTuple_Check(layout) || PyTuple_GET_SIZE(layout) != 4) return 0;
    count = PyLong_AsLongLong(PyTuple_GET_ITEM(layout, 2));
    if (count < 0 || PyObject_GetBuffer(PyTuple_GET_ITEM(layout, 0), &starts, PyBUF_SIMPLE) < 0)
        return 0;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(layout, 1), &ids, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&starts);
        return 0;
    }
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(layout, 3), &skip, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&starts);
        PyBuffer_Release(&ids);
        return 0;
    }
    const int64_t *first = starts.buf, *id = ids.buf, *dead = skip.buf;
    Py_ssize_t shards = starts.len / 8, deleted = skip.len / 8, i = 0;
    if (shards > 0 && ids.len == starts.len) {
        for (; i < n; i++) {
            long long p = PyLong_AsLongLong(PyList_GET_ITEM(items, i));
            if (p < 0 || p >= count) break; /* negative or out of range: the Python path */
            Py_ssize_t lo = 0, hi = deleted; /* deleted records at or before p: skipped */
            while (lo < hi) {
                Py_ssize_t mid = (lo + hi) / 2;
                if (dead[mid] <= p) lo = mid + 1;
                else hi = mid;
            }
            p += lo;
            lo = 0, hi = shards; /* the last shard starting at or before p */
            while (hi - lo > 1) {
                Py_ssize_t mid = (lo + hi) / 2;
                if (first[mid] <= p) lo = mid;
                else hi = mid;
            }
            if (first[lo] > p) break;
            w[i].row.shard_id = id[lo];
            w[i].ordinal = p - first[lo];
        }
    }
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&skip);
    return i == n;
}

/* Each item's row, the lookups in sorted order (`o`: the items, sorted here), the
 * connection's mutex held across them (SQLite's calls inside then take it cheaply):
 * 1, or 0 (AGAIN). */
static int find_rows(Lookup *lk, Want **o, Py_ssize_t n, int by_key, int keyed) {
    sqlite3_stmt *st = lk->stmt;
    int ok = 1;
    if (((ConnHead *)lk->conn)->db != lk->db || lk->pid != getpid()) return 0;
    qsort(o, (size_t)n, sizeof(Want *), by_key ? by_key_order : by_place_in_table);
    sqlite3_mutex *mutex = sqlite3_db_mutex(lk->db);
    sqlite3_mutex_enter(mutex);
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        Want *w = o[i];
        int bound = by_key ? sqlite3_bind_text(st, 1, w->key, (int)w->klen, SQLITE_STATIC)
                           : sqlite3_bind_int64(st, 1, w->row.shard_id);
        if (bound == SQLITE_OK && !by_key) bound = sqlite3_bind_int64(st, 2, w->ordinal);
        ok = bound == SQLITE_OK && find_row(lk, &w->row, keyed && !by_key ? 4 : -1) == 1;
        if (ok && keyed && by_key) w->row.keycrc = crc32c((const uint8_t *)w->key, (size_t)w->klen);
    }
    sqlite3_clear_bindings(st);
    sqlite3_mutex_leave(mutex);
    return ok;
}

/* Each row's source descriptor and its payload's place in the batch's buffer, a
 * frame within GAP bytes after the one before it joining its run (read in one pread,
 * the bytes between them too): the buffer's size, AGAIN_SIZE, or MISSING_SIZE
 * (*missing: a list of the ids of shards without an open plain file source). */
#define AGAIN_SIZE (-2)
#define MISSING_SIZE (-1)
static int64_t lay_out(Want **o, Py_ssize_t n, PyObject *sources, PyObject *file_type, int verify,
                       PyObject **missing) {
    int64_t size = 0;
    qsort(o, (size_t)n, sizeof(Want *), by_place_in_file);
    for (Py_ssize_t i = 0; i < n; i++) {
        Row *r = &o[i]->row;
        if (r->offset < 0 || r->offset > (1LL << 62) || r->length < 0 || r->length > BATCH_MOST ||
            (verify && !r->has_crc))
            return AGAIN_SIZE;
        o[i]->joined = 0;
        if (i == 0 || r->shard_id != o[i - 1]->row.shard_id) {
            PyObject *source;
            o[i]->fd = file_fd(file_type, sources, r->shard_id, &source);
            if (o[i]->fd < 0) {
                if (*missing == NULL && (*missing = PyList_New(0)) == NULL) return AGAIN_SIZE;
                if (append_new(*missing, PyLong_FromLongLong(r->shard_id))) return AGAIN_SIZE;
            }
        } else {
            const Row *prev = &o[i - 1]->row;
            int64_t gap = r->offset - (prev->offset + prev->length);
            o[i]->fd = o[i - 1]->fd;
            o[i]->joined = gap >= 0 && gap <= GAP;
        }
        o[i]->at = o[i]->joined ? o[i - 1]->at + (r->offset - o[i - 1]->row.offset) : size;
        size = o[i]->at + r->length;
        if (size > BATCH_MOST) return AGAIN_SIZE;
    }
    return *missing != NULL ? MISSING_SIZE : size;
}

/* Read every run into `buf` and check each payload (the GIL released): 1, or 0. */
static int read_all(Want **o, Py_ssize_t n, char *buf, int verify) {
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS for (Py_ssize_t i = 0; i < n && ok;) {
        Py_ssize_t j = i; /* the run: i up to j */
        while (j + 1 < n && o[j + 1]->joined) j++;
        int64_t want = o[j]->at + o[j]->row.length - o[i]->at, done = 0;
        off_t from = (off_t)(o[i]->row.offset + TFRECORD_HEADER);
        while (done < want) {
            ssize_t got = pread(o[i]->fd, buf + o[i]->at + done, (size_t)(want - done), from + done);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) break;
            done += got;
        }
        ok = done == want;
        for (; ok && i <= j; i++) {
            const uint8_t *p = (const uint8_t *)buf + o[i]->at;
            ok = !verify || (crc32c(p, (size_t)o[i]->row.length) ^ o[i]->row.keycrc) ==
                                (uint32_t)o[i]->row.crc;
        }
    }
    Py_END_ALLOW_THREADS return ok;
}

/* Whether every shard's file read is still the version its source saw. */
static int files_unchanged(Want **o, Py_ssize_t n, PyObject *sources) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i > 0 && o[i]->row.shard_id == o[i - 1]->row.shard_id) continue;
        PyObject *key = PyLong_FromLongLong(o[i]->row.shard_id), *source, *seen;
        source = key == NULL ? NULL : PyDict_GetItemWithError(sources, key);
        Py_XDECREF(key);
        seen = source == NULL ? NULL : PyObject_GetAttr(source, s_seen);
        int same = seen != NULL && unchanged(o[i]->fd, seen);
        Py_XDECREF(seen);
        if (!same) return 0;
    }
    return 1;
}

/* The items in batch order: payloads, or dicts (an unsettled one AGAIN). */
static PyObject *items_of(Want *w, Py_ssize_t n, const char *buf, int dicts, PyObject *select) {
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        const uint8_t *p = (const uint8_t *)buf + w[i].at;
        PyObject *item;
        if (!dicts) {
            item = PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)w[i].row.length);
        } else if (!example_items(p, p + w[i].row.length, select, &item)) {
            PyErr_Clear();
            item = Py_NewRef(AGAIN);
        }
        if (item == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyObject *py_read_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !PyObject_TypeCheck(args[0], &LookupType) || !PyList_Check(args[1]) ||
        !PyDict_Check(args[3]) || (args[7] != Py_None && !PyTuple_Check(args[7]))) {
        PyErr_SetString(PyExc_TypeError, "read_batch(lookup, items: list, layout, sources: dict, "
                                         "verify, keyed, dicts, select: tuple | None)");
        return NULL;
    }
    Lookup *lk = (Lookup *)args[0];
    PyObject *items = args[1], *layout = args[2], *sources = args[3], *missing = NULL;
    PyObject *select = args[7] == Py_None ? NULL : args[7], *out = NULL;
    int verify = PyObject_IsTrue(args[4]), keyed = PyObject_IsTrue(args[5]);
    int dicts = PyObject_IsTrue(args[6]), by_key = layout == Py_None;
    if (verify < 0 || keyed < 0 || dicts < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    Want *w = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Want));
    Want **o = PyMem_Malloc((n ? (size_t)n : 1) * sizeof(Want *)); /* w in some order */
    char *buf = NULL;
    if (w == NULL || o == NULL) {
        PyMem_Free(w);
        PyMem_Free(o);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) o[i] = &w[i];
    int64_t size = AGAIN_SIZE;
    if (n == 0) size = 0;
    else if (place_items(w, items, layout) && find_rows(lk, o, n, by_key, keyed))
        size = lay_out(o, n, sources, lk->file_type, verify, &missing);
    size_t held = 0; /* the buffer's size */
    if (size >= 0) {
        buf = take_buffer((size_t)size, &held);
        if (buf != NULL && read_all(o, n, buf, verify) && files_unchanged(o, n, sources))
            out = items_of(w, n, buf, dicts, select);
    }
    give_back(buf, held);
    PyMem_Free(o);
    PyMem_Free(w);
    if (size == MISSING_SIZE) {
        PyErr_Clear();
        return Py_BuildValue("(N)", missing);
    }
    Py_XDECREF(missing);
    if (out == NULL) { /* anything unsure: the Python path */
        PyErr_Clear();
        return Py_NewRef(AGAIN);
    }
    return out;
}

#endif
