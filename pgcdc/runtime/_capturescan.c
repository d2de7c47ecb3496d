/* Capture records in chunks: the record layout of pgcdc/runtime/capture.py, read in C.
 *
 * scan(buffer, start, end, max_records, max_bytes, allowed)
 *     -> (stop, keys, tags, lsns, offsets, values)
 *
 * Reads records from byte `start` to byte `end` of `buffer` (header: version u1, flags u1, lsn u8,
 * length u4, big-endian; then the message) until `max_records` records, or until their
 * messages hold `max_bytes` (at least one record is taken), the end of the buffer, or a record
 * that is not plain: a header whose key (version * 4 + flags) `allowed` (bytes, 256 entries)
 * does not allow, or a record running past the end. `stop` is where it stopped: the
 * caller's own reader takes over there and reports whatever is wrong, with its offset.
 *
 * keys: bytes, one key per record; tags: bytes, each message's first byte (0 for an empty
 * one); lsns: bytes of native uint64; offsets: bytes of native
 * int32, one more than the records (an Arrow binary array's offsets into `values`); values:
 * the messages, one after the other. Spec-independent: the generated decoders read them.
 *
 * last_tags(buffer, start, end, opens, closes) -> (stop, last_open, last_close_end)
 *
 * Walks the record headers of buffer[start:end] without copying anything, until the end or a
 * record running past it (`stop`: the end of the last whole record). `last_open` is the offset
 * of the last record whose message's first byte `opens` (bytes, 256 entries) marks, -1 if
 * none; `last_close_end` the offset just past the last record `closes` marks, -1 if none.
 * pgcdc.sources finds a capture's last commit boundary with it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEADER 14

static PyObject *scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer data, allowed;
    Py_ssize_t start, end, max_records, max_bytes;
    PyObject *keys = NULL, *tags = NULL, *lsns = NULL, *offsets = NULL, *values = NULL, *out = NULL;
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "scan(buffer, start, end, max_records, max_bytes, allowed)");
        return NULL;
    }
    start = PyLong_AsSsize_t(args[1]);
    end = PyLong_AsSsize_t(args[2]);
    max_records = PyLong_AsSsize_t(args[3]);
    max_bytes = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[5], &allowed, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (allowed.len != 256 || start < 0 || end < start || end > data.len || max_records < 1 ||
        max_bytes < 1) {
        PyErr_SetString(PyExc_ValueError, "scan: bad arguments");
        goto done;
    }
    if (max_bytes > INT32_MAX) max_bytes = INT32_MAX;

    const unsigned char *d = data.buf, *ok = allowed.buf;
    Py_ssize_t n = end, off = start, count = 0, total = 0;
    /* first pass: how many records, and how many bytes of messages */
    while (count < max_records && n - off >= HEADER) {
        const unsigned char *h = d + off;
        unsigned key = h[0] < 64 && h[1] < 4 ? (unsigned)h[0] * 4 + h[1] : 255;
        uint32_t len = ((uint32_t)h[10] << 24) | ((uint32_t)h[11] << 16) |
                       ((uint32_t)h[12] << 8) | h[13];
        if (!ok[key] || (Py_ssize_t)len > n - off - HEADER) break;
        if (count && (Py_ssize_t)len > max_bytes - total) break;
        if ((Py_ssize_t)len > INT32_MAX - total) break;
        total += len;
        off += HEADER + len;
        count++;
    }
    keys = PyBytes_FromStringAndSize(NULL, count);
    tags = PyBytes_FromStringAndSize(NULL, count);
    lsns = PyBytes_FromStringAndSize(NULL, count * 8);
    offsets = PyBytes_FromStringAndSize(NULL, (count + 1) * 4);
    values = PyBytes_FromStringAndSize(NULL, total);
    if (keys == NULL || tags == NULL || lsns == NULL || offsets == NULL || values == NULL) goto done;
    {
        unsigned char *k = (unsigned char *)PyBytes_AS_STRING(keys);
        unsigned char *t = (unsigned char *)PyBytes_AS_STRING(tags);
        uint64_t *l = (uint64_t *)PyBytes_AS_STRING(lsns);
        int32_t *o = (int32_t *)PyBytes_AS_STRING(offsets);
        char *v = PyBytes_AS_STRING(values);
        Py_ssize_t at = start, pos = 0;
        for (Py_ssize_t i = 0; i < count; i++) {
            const unsigned char *h = d + at;
            uint64_t lsn = 0;
            for (int b = 2; b < 10; b++) lsn = (lsn << 8) | h[b];
            uint32_t len = ((uint32_t)h[10] << 24) | ((uint32_t)h[11] << 16) |
                           ((uint32_t)h[12] << 8) | h[13];
            k[i] = (unsigned char)(h[0] * 4 + h[1]);
            t[i] = len ? h[HEADER] : 0;
            l[i] = lsn;
            o[i] = (int32_t)pos;
            memcpy(v + pos, h + HEADER, len);
            pos += len;
            at += HEADER + len;
        }
        o[count] = (int32_t)pos;
    }
    out = Py_BuildValue("nOOOOO", off, keys, tags, lsns, offsets, values);
done:
    Py_XDECREF(keys);
    Py_XDECREF(tags);
    Py_XDECREF(lsns);
    Py_XDECREF(offsets);
    Py_XDECREF(values);
    PyBuffer_Release(&data);
    PyBuffer_Release(&allowed);
    return out;
}

static PyObject *last_tags(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer data, opens, closes;
    Py_ssize_t start, end;
    PyObject *out = NULL;
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "last_tags(buffer, start, end, opens, closes)");
        return NULL;
    }
    start = PyLong_AsSsize_t(args[1]);
    end = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return NULL;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[3], &opens, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (PyObject_GetBuffer(args[4], &closes, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&opens);
        PyBuffer_Release(&data);
        return NULL;
    }
    if (opens.len != 256 || closes.len != 256 || start < 0 || end < start || end > data.len) {
        PyErr_SetString(PyExc_ValueError, "last_tags: bad arguments");
        goto done;
    }
    {
        const unsigned char *d = data.buf, *o = opens.buf, *c = closes.buf;
        Py_ssize_t off = start, last_open = -1, last_close = -1;
        while (end - off >= HEADER) {
            const unsigned char *h = d + off;
            uint32_t len = ((uint32_t)h[10] << 24) | ((uint32_t)h[11] << 16) |
                           ((uint32_t)h[12] << 8) | h[13];
            if ((Py_ssize_t)len > end - off - HEADER) break;
            if (len) {
                unsigned char tag = h[HEADER];
                if (o[tag]) last_open = off;
                if (c[tag]) last_close = off + HEADER + len;
            }
            off += HEADER + len;
        }
        out = Py_BuildValue("nnn", off, last_open, last_close);
    }
done:
    PyBuffer_Release(&closes);
    PyBuffer_Release(&opens);
    PyBuffer_Release(&data);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(buffer, start, end, max_records, max_bytes, allowed) -> "
     "(stop, keys, tags, lsns, offsets, values)"},
    {"last_tags", (PyCFunction)(void (*)(void))last_tags, METH_FASTCALL,
     "last_tags(buffer, start, end, opens, closes) -> (stop, last_open, last_close_end)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_capturescan", "Capture records in chunks, read in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__capturescan(void)
{
    return PyModule_Create(&module);
}
