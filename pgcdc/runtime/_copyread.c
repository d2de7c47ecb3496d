/* A replication stream's XLogData appended to a bytearray as capture records, in C.
 *
 * records(get_copy_data, freemem, pgconn, out, limit, version, flags, python)
 *     -> (status, count, high_lsn, wal_end, message)
 *
 * get_copy_data and freemem are the addresses of libpq's PQgetCopyData and PQfreemem, pgconn
 * the PGconn * of a connection in COPY BOTH (psycopg's pgconn.pgconn_ptr): the caller found
 * them in the libpq psycopg uses, and checked them. Takes the messages libpq has whole,
 * without waiting; each XLogData whose message's first byte `python` (bytes, 256 entries)
 * does not mark is appended to `out` as a capture record (version u1, flags u1, lsn u8,
 * length u4, big-endian; then the message), until `out` holds `limit` bytes.
 *
 * status: 0 nothing more in libpq's buffer; 1 `message` (bytes) is a CopyData for the
 * caller: not XLogData, too short, or marked in `python` (begin, commit, relation, ...);
 * 2 `limit` reached; -1 or -2 what PQgetCopyData returned (the copy ended, an error: the
 * caller asks libpq why). count: records appended; high_lsn, wal_end: the highest XLogData
 * start and the last wal_end among them (0 when none).
 *
 * The per-message loop in Python (pgcdc.capture.stream.ReplicationStream.read_records) took
 * about 2 microseconds a message, half of a typed read of the streaming source.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef int (*get_copy_data_fn)(void *conn, char **buffer, int async);
typedef void (*freemem_fn)(void *ptr);

#define XLOG_AT 25 /* 'w', wal_start u8, wal_end u8, send_time u8 */
#define HEADER 14

static uint64_t be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
}

static PyObject *records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "records(get_copy_data, freemem, pgconn, out, limit, version, flags, "
                        "python)");
        return NULL;
    }
    void *get_ptr = PyLong_AsVoidPtr(args[0]);
    void *free_ptr = PyLong_AsVoidPtr(args[1]);
    void *conn = PyLong_AsVoidPtr(args[2]);
    PyObject *out = args[3];
    Py_ssize_t limit = PyLong_AsSsize_t(args[4]);
    long version = PyLong_AsLong(args[5]);
    long flags = PyLong_AsLong(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (!get_ptr || !free_ptr || !conn || !PyByteArray_Check(out) || version < 0 ||
        version > 255 || flags < 0 || flags > 255) {
        PyErr_SetString(PyExc_ValueError, "records: bad arguments");
        return NULL;
    }
    Py_buffer marks;
    if (PyObject_GetBuffer(args[7], &marks, PyBUF_SIMPLE) < 0) return NULL;
    if (marks.len != 256) {
        PyBuffer_Release(&marks);
        PyErr_SetString(PyExc_ValueError, "records: python must have 256 entries");
        return NULL;
    }
    const unsigned char *python = marks.buf;
    get_copy_data_fn get = (get_copy_data_fn)get_ptr;
    freemem_fn freemem = (freemem_fn)free_ptr;
    long status = 0;
    Py_ssize_t count = 0;
    uint64_t high = 0, wal_end = 0;
    PyObject *message = NULL;
    for (;;) {
        char *buf = NULL;
        int n = get(conn, &buf, 1);
        if (n <= 0) {
            status = n; /* 0: nothing whole yet; -1, -2: the caller asks why */
            if (buf) freemem(buf);
            break;
        }
        const unsigned char *m = (const unsigned char *)buf;
        if (m[0] != 'w' || n <= XLOG_AT || python[m[XLOG_AT]]) {
            message = PyBytes_FromStringAndSize(buf, n);
            freemem(buf);
            if (!message) {
                PyBuffer_Release(&marks);
                return NULL;
            }
            status = 1;
            break;
        }
        uint64_t lsn = be64(m + 1);
        wal_end = be64(m + 9);
        if (lsn > high) high = lsn;
        Py_ssize_t len = PyByteArray_GET_SIZE(out);
        Py_ssize_t size = n - XLOG_AT;
        if (PyByteArray_Resize(out, len + HEADER + size) < 0) {
            freemem(buf);
            PyBuffer_Release(&marks);
            return NULL;
        }
        unsigned char *w = (unsigned char *)PyByteArray_AS_STRING(out) + len;
        w[0] = (unsigned char)version;
        w[1] = (unsigned char)flags;
        for (int i = 0; i < 8; i++) w[2 + i] = (unsigned char)(lsn >> (56 - 8 * i));
        uint32_t s = (uint32_t)size;
        w[10] = (unsigned char)(s >> 24);
        w[11] = (unsigned char)(s >> 16);
        w[12] = (unsigned char)(s >> 8);
        w[13] = (unsigned char)s;
        memcpy(w + HEADER, m + XLOG_AT, (size_t)size);
        freemem(buf);
        count++;
        if (len + HEADER + size >= limit) {
            status = 2;
            break;
        }
    }
    PyBuffer_Release(&marks);
    if (!message) {
        message = Py_None;
        Py_INCREF(message);
    }
    return Py_BuildValue("(lnKKN)", status, count, (unsigned long long)high,
                         (unsigned long long)wal_end, message);
}

static PyMethodDef methods[] = {
    {"records", (PyCFunction)(void (*)(void))records, METH_FASTCALL,
     "records(get_copy_data, freemem, pgconn, out, limit, version, flags, python) -> "
     "(status, count, high_lsn, wal_end, message)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_copyread", "A replication stream's XLogData as capture records, in C.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__copyread(void) { return PyModule_Create(&module); }
