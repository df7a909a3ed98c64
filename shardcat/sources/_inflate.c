/* shardcat.sources._inflate: one-pass gzip decompression that also records seek points.
 *
 * GzipIndexer(path, spacing, chunk) decompresses a gzip file (one or more members) in a
 * single pass with the system zlib. read() returns the decompressed bytes in chunks of up
 * to `chunk` bytes (b"" once the whole file is read and checked: every member's CRC-32
 * and ISIZE, zero padding after a member allowed, anything else after it an error).
 * While it inflates it stops at every deflate block boundary (Z_BLOCK) and, once
 * `spacing` bytes of output have passed since the last point, records a seek point
 * (compressed byte offset, bit offset, decompressed offset, the 32 KiB window before
 * it); each member's start is a point without a window. export() returns those points
 * in indexed_gzip's index file layout (version 1: "GZIDX", sizes, spacing, window size,
 * point count, 18-byte point records, then the windows), which its import_index reads.
 *
 * Damaged input raises GzipIndexerError(message, offset), offset being the decompressed
 * offset where the good bytes end; the good bytes before it are returned first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#define WINDOW 32768
#define INBUF (1 << 20)
#define POINT_SIZE 18

static PyObject *IndexerError;

typedef struct {
    PyObject_HEAD
    FILE *file;
    uint64_t file_size;
    uint64_t spacing;
    Py_ssize_t chunk;
    z_stream strm;
    int strm_ready;
    gz_header head;
    unsigned char *in;
    uint64_t consumed;     /* compressed bytes inflate has consumed */
    uint64_t produced;     /* decompressed bytes produced */
    uint64_t last_point;   /* decompressed offset of the last point */
    int in_member;         /* inside a member (header seen, end not yet) */
    int member_started;    /* the current member's start point is recorded */
    int done;              /* the whole file is read and checked */
    char *error;           /* pending error (raised on the next read) */
    uint64_t error_at;
    unsigned char hist[WINDOW];  /* the last WINDOW bytes of output before this chunk */
    uint64_t hist_len;
    /* points: records (POINT_SIZE each) and windows */
    unsigned char *points;
    size_t npoints, points_cap;
    unsigned char *windows;
    size_t nwindows, windows_cap;
} Indexer;

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static int grow(unsigned char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t cap2 = *cap ? *cap : 4096;
    while (cap2 < need) cap2 *= 2;
    unsigned char *p = realloc(*buf, cap2);
    if (p == NULL) return -1;
    *buf = p;
    *cap = cap2;
    return 0;
}

/* The WINDOW bytes of output before the current position: the tail of `out` (the
 * `len` bytes of this chunk so far) after the tail of the history. */
static void window_of(Indexer *self, const unsigned char *out, size_t len, unsigned char *dst) {
    if (len >= WINDOW) {
        memcpy(dst, out + len - WINDOW, WINDOW);
        return;
    }
    size_t from_hist = WINDOW - len;
    memcpy(dst, self->hist + WINDOW - from_hist, from_hist);
    memcpy(dst + from_hist, out, len);
}

static int add_point(Indexer *self, uint64_t cmp, uint8_t bits, const unsigned char *out,
                     size_t len, int with_window) {
    if (grow(&self->points, &self->points_cap, (self->npoints + 1) * POINT_SIZE) < 0) return -1;
    unsigned char *p = self->points + self->npoints * POINT_SIZE;
    put_u64(p, cmp);
    put_u64(p + 8, self->produced);
    p[16] = bits;
    p[17] = with_window ? 1 : 0;
    self->npoints++;
    if (with_window) {
        if (grow(&self->windows, &self->windows_cap, (self->nwindows + 1) * WINDOW) < 0)
            return -1;
        window_of(self, out, len, self->windows + self->nwindows * WINDOW);
        self->nwindows++;
    }
    self->last_point = self->produced;
    return 0;
}

static void fail(Indexer *self, const char *msg) {
    if (self->error == NULL) {
        self->error = strdup(msg ? msg : "invalid data");
        self->error_at = self->produced;
    }
}

/* Start the next member's inflate state (the header pointer is reset by inflateReset). */
static int start_member(Indexer *self) {
    if (inflateReset(&self->strm) != Z_OK) return -1;
    memset(&self->head, 0, sizeof(self->head));
    if (inflateGetHeader(&self->strm, &self->head) != Z_OK) return -1;
    self->in_member = 1;
    self->member_started = 0;
    return 0;
}

static int refill(Indexer *self) {
    if (self->strm.avail_in > 0) return 1;
    size_t n = fread(self->in, 1, INBUF, self->file);
    if (n == 0 && ferror(self->file)) return -1;
    self->strm.next_in = self->in;
    self->strm.avail_in = (uInt)n;
    return n > 0;
}

/* Inflate into out[0:cap]; returns the bytes written. Sets done/error on the way.
 * Called without the GIL. */
static size_t fill(Indexer *self, unsigned char *out, size_t cap) {
    size_t len = 0;
    while (len < cap && !self->done && self->error == NULL) {
        int r = refill(self);
        if (r < 0) {
            fail(self, "read error");
            break;
        }
        if (!self->in_member) {
            /* between members: skip zero padding; EOF ends the file */
            if (r == 0) {
                self->done = 1;
                break;
            }
            while (self->strm.avail_in > 0 && *self->strm.next_in == 0) {
                self->strm.next_in++;
                self->strm.avail_in--;
                self->consumed++;
            }
            if (self->strm.avail_in == 0) continue;
            if (start_member(self) < 0) {
                fail(self, "zlib reset failed");
                break;
            }
        }
        if (r == 0) {
            fail(self, "compressed file ended before the end-of-stream marker was reached");
            break;
        }
        uInt in_before = self->strm.avail_in;
        self->strm.next_out = out + len;
        self->strm.avail_out = (uInt)(cap - len);
        int ret = inflate(&self->strm, Z_BLOCK);
        size_t out_n = (cap - len) - self->strm.avail_out;
        self->consumed += in_before - self->strm.avail_in;
        self->produced += out_n;
        len += out_n;
        if (ret == Z_BUF_ERROR) ret = Z_OK; /* no progress possible: more input or output */
        if (ret != Z_OK && ret != Z_STREAM_END) {
            fail(self, self->strm.msg ? self->strm.msg : "invalid data");
            break;
        }
        if (!self->member_started && self->head.done == 1) {
            /* right after the header (Z_BLOCK returns there): the member's start */
            self->member_started = 1;
            if (add_point(self, self->consumed, 0, out, len, 0) < 0) {
                fail(self, "out of memory");
                break;
            }
        }
        if (ret == Z_STREAM_END) {
            self->in_member = 0; /* CRC-32 and ISIZE checked by zlib */
            continue;
        }
        int type = self->strm.data_type;
        if ((type & 128) && !(type & 64) && self->produced - self->last_point >= self->spacing) {
            if (add_point(self, self->consumed, (uint8_t)(type & 7), out, len, 1) < 0) {
                fail(self, "out of memory");
                break;
            }
        }
    }
    return len;
}

static void remember_tail(Indexer *self, const unsigned char *out, size_t len) {
    if (len >= WINDOW) {
        memcpy(self->hist, out + len - WINDOW, WINDOW);
    } else if (len > 0) {
        memmove(self->hist, self->hist + len, WINDOW - len);
        memcpy(self->hist + WINDOW - len, out, len);
    }
    self->hist_len += len;
}

static PyObject *raise_pending(Indexer *self) {
    PyObject *args = Py_BuildValue("(sK)", self->error, (unsigned long long)self->error_at);
    if (args != NULL) {
        PyErr_SetObject(IndexerError, args);
        Py_DECREF(args);
    }
    return NULL;
}

static PyObject *Indexer_read(Indexer *self, PyObject *Py_UNUSED(ignored)) {
    if (self->file == NULL) {
        PyErr_SetString(PyExc_ValueError, "read of a closed GzipIndexer");
        return NULL;
    }
    if (self->error != NULL) return raise_pending(self);
    if (self->done) return PyBytes_FromStringAndSize(NULL, 0);
    PyObject *buf = PyBytes_FromStringAndSize(NULL, self->chunk);
    if (buf == NULL) return NULL;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(buf);
    size_t len;
    Py_BEGIN_ALLOW_THREADS
    len = fill(self, out, (size_t)self->chunk);
    remember_tail(self, out, len);
    Py_END_ALLOW_THREADS
    if (len == 0) {
        Py_DECREF(buf);
        if (self->error != NULL) return raise_pending(self);
        return PyBytes_FromStringAndSize(NULL, 0);
    }
    if ((Py_ssize_t)len < self->chunk && _PyBytes_Resize(&buf, (Py_ssize_t)len) < 0) return NULL;
    return buf;
}

static PyObject *Indexer_export(Indexer *self, PyObject *Py_UNUSED(ignored)) {
    if (!self->done) {
        PyErr_SetString(PyExc_ValueError, "export before the whole file was read");
        return NULL;
    }
    /* the end of the file is a point too (as indexed_gzip makes it), so that reads past
     * the last block point are covered */
    size_t n = self->npoints + 1, nw = self->nwindows + 1;
    size_t size = 35 + n * POINT_SIZE + nw * WINDOW;
    PyObject *res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (res == NULL) return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(res);
    memcpy(p, "GZIDX", 5);
    p[5] = 1;
    p[6] = 0;
    put_u64(p + 7, self->file_size);
    put_u64(p + 15, self->produced);
    put_u32(p + 23, (uint32_t)self->spacing);
    put_u32(p + 27, WINDOW);
    put_u32(p + 31, (uint32_t)n);
    p += 35;
    memcpy(p, self->points, self->npoints * POINT_SIZE);
    p += self->npoints * POINT_SIZE;
    put_u64(p, self->file_size);
    put_u64(p + 8, self->produced);
    p[16] = 0;
    p[17] = 1;
    p += POINT_SIZE;
    memcpy(p, self->windows, self->nwindows * WINDOW);
    p += self->nwindows * WINDOW;
    if (self->hist_len >= WINDOW) {
        memcpy(p, self->hist, WINDOW);
    } else {
        memset(p, 0, WINDOW - self->hist_len);
        memcpy(p + WINDOW - self->hist_len, self->hist + WINDOW - self->hist_len, self->hist_len);
    }
    return res;
}

static PyObject *Indexer_npoints(Indexer *self, void *Py_UNUSED(closure)) {
    return PyLong_FromSize_t(self->npoints);
}

static void release(Indexer *self) {
    if (self->strm_ready) {
        inflateEnd(&self->strm);
        self->strm_ready = 0;
    }
    if (self->file != NULL) {
        fclose(self->file);
        self->file = NULL;
    }
    free(self->in);
    self->in = NULL;
    free(self->points);
    self->points = NULL;
    free(self->windows);
    self->windows = NULL;
    free(self->error);
    self->error = NULL;
}

static PyObject *Indexer_close(Indexer *self, PyObject *Py_UNUSED(ignored)) {
    release(self);
    Py_RETURN_NONE;
}

static void Indexer_dealloc(Indexer *self) {
    release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Indexer_init(Indexer *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"path", "spacing", "chunk", NULL};
    PyObject *path = NULL;
    unsigned long long spacing;
    Py_ssize_t chunk;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&Kn", kwlist, PyUnicode_FSConverter, &path,
                                     &spacing, &chunk))
        return -1;
    release(self);
    if (spacing < WINDOW || spacing > UINT32_MAX || chunk <= 0) {
        Py_DECREF(path);
        PyErr_SetString(PyExc_ValueError, "spacing must be in [32768, 2**32), chunk > 0");
        return -1;
    }
    self->spacing = spacing;
    self->chunk = chunk;
    self->file = fopen(PyBytes_AS_STRING(path), "rb");
    if (self->file == NULL) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
        Py_DECREF(path);
        return -1;
    }
    Py_DECREF(path);
    struct stat st;
    if (fstat(fileno(self->file), &st) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        release(self);
        return -1;
    }
    self->file_size = (uint64_t)st.st_size;
    self->in = malloc(INBUF);
    if (self->in == NULL) {
        PyErr_NoMemory();
        release(self);
        return -1;
    }
    memset(&self->strm, 0, sizeof(self->strm));
    if (inflateInit2(&self->strm, 16 + MAX_WBITS) != Z_OK) {
        PyErr_SetString(PyExc_MemoryError, "zlib inflateInit2 failed");
        release(self);
        return -1;
    }
    self->strm_ready = 1;
    self->consumed = self->produced = self->last_point = self->hist_len = 0;
    self->npoints = self->nwindows = 0;
    self->in_member = self->member_started = self->done = 0;
    memset(self->hist, 0, WINDOW);
    /* the file starts with a member (the magic bytes were checked by the caller) */
    if (start_member(self) < 0) {
        PyErr_SetString(PyExc_MemoryError, "zlib inflateReset failed");
        release(self);
        return -1;
    }
    return 0;
}

static PyMethodDef Indexer_methods[] = {
    {"read", (PyCFunction)Indexer_read, METH_NOARGS,
     "The next chunk of decompressed bytes; b'' at the end (everything checked)."},
    {"export", (PyCFunction)Indexer_export, METH_NOARGS,
     "The seek points in indexed_gzip's index file layout (after the last read)."},
    {"close", (PyCFunction)Indexer_close, METH_NOARGS, "Close the file, free the points."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Indexer_getset[] = {
    {"npoints", (getter)Indexer_npoints, NULL, "Points recorded so far (without the end).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject IndexerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shardcat.sources._inflate.GzipIndexer",
    .tp_basicsize = sizeof(Indexer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "GzipIndexer(path, spacing, chunk): one-pass gzip decompression with seek points.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Indexer_init,
    .tp_dealloc = (destructor)Indexer_dealloc,
    .tp_methods = Indexer_methods,
    .tp_getset = Indexer_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_inflate",
    "One-pass gzip decompression recording indexed_gzip-compatible seek points.", -1, NULL,
};

PyMODINIT_FUNC PyInit__inflate(void) {
    if (PyType_Ready(&IndexerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    IndexerError = PyErr_NewException("shardcat.sources._inflate.GzipIndexerError", NULL, NULL);
    if (IndexerError == NULL || PyModule_AddObject(m, "GzipIndexerError", IndexerError) < 0) {
        Py_XDECREF(IndexerError);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&IndexerType);
    if (PyModule_AddObject(m, "GzipIndexer", (PyObject *)&IndexerType) < 0) {
        Py_DECREF(&IndexerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
