/* Helpers of the generated C accelerators (pgcdc runtime; spec-independent).
 *
 * Included once by each generated _speedups.c: everything here is static. Decoders only take
 * well-formed input; anything unusual raises Retry and the Python code of the same codec
 * decides (and reports the precise error).
 */
#ifndef PGCDC_SPEEDUPS_H
#define PGCDC_SPEEDUPS_H

#include <Python.h>
#include <structmember.h>
#include <string.h>

static PyObject *Retry;  /* pgcdc.runtime.decoding.Retry: "let the Python code handle this" */

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static inline unsigned long long rd(const unsigned char *p, int size)
{
    unsigned long long v = 0;
    for (int i = 0; i < size; i++) v = (v << 8) | p[i];
    return v;
}

static inline long long rd_signed(const unsigned char *p, int size)
{
    unsigned long long v = rd(p, size);
    int shift = 64 - 8 * size;
    return (long long)(v << shift) >> shift;
}

static inline void wr(unsigned char *p, unsigned long long v, int size)
{
    for (int i = size - 1; i >= 0; i--) { p[i] = (unsigned char)v; v >>= 8; }
}

static PyObject *retry(void)
{
    PyErr_SetNone(Retry);
    return NULL;
}

typedef struct {
    unsigned char *p;
    Py_ssize_t len, cap;
    unsigned char small[512];
} Buf;

static int grow(Buf *b, Py_ssize_t need)
{
    Py_ssize_t cap = b->cap * 2;
    while (cap - b->len < need) cap *= 2;
    unsigned char *p = PyMem_Malloc((size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(p, b->p, (size_t)b->len);
    if (b->p != b->small) PyMem_Free(b->p);
    b->p = p;
    b->cap = cap;
    return 0;
}

#define ROOM(b, k) do { if ((b)->cap - (b)->len < (k) && grow((b), (k)) < 0) goto fail; } while (0)

/* A str of one character that the choice table allows: its byte, else -1. */
static inline int choice_byte(PyObject *v, PyObject **table)
{
    if (!PyUnicode_CheckExact(v) || PyUnicode_GET_LENGTH(v) != 1) return -1;
    Py_UCS4 ch = PyUnicode_READ_CHAR(v, 0);
    return ch < 256 && table[ch] != NULL ? (int)ch : -1;
}

/* An exact int within [lo, hi] (the Python encoder reports anything else). */
static inline int int_in(PyObject *v, long long lo, long long hi, long long *out)
{
    int overflow;
    if (!PyLong_CheckExact(v)) return -1;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    return *out < lo || *out > hi ? -1 : 0;
}

static inline int uint64_of(PyObject *v, unsigned long long *out)
{
    if (!PyLong_CheckExact(v)) return -1;
    *out = PyLong_AsUnsignedLongLong(v);
    if (*out == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

static inline int load_type(PyObject *ns, const char *name, PyTypeObject **out)
{
    PyObject *t = PyDict_GetItemString(ns, name);
    if (t == NULL || !PyType_Check(t)) {
        PyErr_Format(PyExc_RuntimeError, "_speedups: %s is not a class", name);
        return -1;
    }
    Py_INCREF(t);
    *out = (PyTypeObject *)t;
    return 0;
}

/* The byte offset of a __slots__ field, read from its member descriptor. */
static inline int load_slot(PyTypeObject *t, const char *name, Py_ssize_t *out)
{
    PyObject *descr = PyObject_GetAttrString((PyObject *)t, name);
    if (descr == NULL) return -1;
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
        ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
        Py_DECREF(descr);
        PyErr_Format(PyExc_RuntimeError, "_speedups: %s.%s is not a slot", t->tp_name, name);
        return -1;
    }
    *out = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    return 0;
}

/* A 256-entry table from its Python twin (a tuple indexed by byte, None for "not allowed"). */
static inline int load_table(PyObject *ns, const char *name, PyObject **table)
{
    PyObject *t = PyDict_GetItemString(ns, name);
    if (t == NULL || !PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 256) {
        PyErr_Format(PyExc_RuntimeError, "_speedups: %s is not a byte table", name);
        return -1;
    }
    for (int i = 0; i < 256; i++) {
        PyObject *v = PyTuple_GET_ITEM(t, i);
        table[i] = v == Py_None ? NULL : Py_NewRef(v);
    }
    return 0;
}

/* Append a new reference to a list and drop it (the column decoders' appends). */
static inline int append_steal(PyObject *list, PyObject *item)
{
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

/* [a, b] from two new references (either may be NULL after a failed allocation). */
static inline PyObject *pair(PyObject *a, PyObject *b)
{
    PyObject *p = a != NULL && b != NULL ? PyList_New(2) : NULL;
    if (p == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        return NULL;
    }
    PyList_SET_ITEM(p, 0, a);
    PyList_SET_ITEM(p, 1, b);
    return p;
}

/* -- the whole-batch decoders' arguments (decode_columns, decode_arrow) ----------------------
 * (offsets, data, wide, first, count, gates): an Arrow binary array's buffers (wide: a
 * large_binary one), its offset `first` and `count` rows, and the gates, one tuple for every
 * row or a list of one per row. */
typedef struct {
    Py_buffer ob, db;
    PyObject *gates;
    Py_ssize_t first, count;
    int wide;
} Batch;

/* 0, or -1 with an exception set (Retry: arguments the Python code must look at); after 0 the
 * caller calls batch_release. */
static int batch_open(Batch *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        retry();
        return -1;
    }
    b->wide = PyObject_IsTrue(args[2]);
    b->first = PyLong_AsSsize_t(args[3]);
    b->count = PyLong_AsSsize_t(args[4]);
    b->gates = args[5];
    if (b->wide < 0 || (b->first == -1 && PyErr_Occurred()) ||
        (b->count == -1 && PyErr_Occurred()))
        return -1;
    if (PyList_CheckExact(b->gates) ? PyList_GET_SIZE(b->gates) != b->count
                                    : !PyTuple_CheckExact(b->gates)) {
        retry();
        return -1;
    }
    if (PyObject_GetBuffer(args[0], &b->ob, PyBUF_SIMPLE) < 0) return -1;
    if (PyObject_GetBuffer(args[1], &b->db, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&b->ob);
        return -1;
    }
    if (b->first < 0 || b->count < 0 || (b->first + b->count + 1) * (b->wide ? 8 : 4) > b->ob.len) {
        PyBuffer_Release(&b->ob);
        PyBuffer_Release(&b->db);
        retry();
        return -1;
    }
    return 0;
}

static void batch_release(Batch *b)
{
    PyBuffer_Release(&b->ob);
    PyBuffer_Release(&b->db);
}

/* Row i's message (*d, *n) and its gates *g, a tuple of `ngates` items; -1 with Retry for a
 * row the C code does not take. */
static int batch_row(Batch *b, Py_ssize_t i, Py_ssize_t ngates, const unsigned char **d,
                     Py_ssize_t *n, PyObject **g)
{
    long long start, end;
    PyObject *gi = PyList_CheckExact(b->gates) ? PyList_GET_ITEM(b->gates, i) : b->gates;
    if (b->wide) {
        start = ((const long long *)b->ob.buf)[b->first + i];
        end = ((const long long *)b->ob.buf)[b->first + i + 1];
    } else {
        start = ((const int *)b->ob.buf)[b->first + i];
        end = ((const int *)b->ob.buf)[b->first + i + 1];
    }
    if (start < 0 || end <= start || end > b->db.len || !PyTuple_CheckExact(gi) ||
        PyTuple_GET_SIZE(gi) != ngates) {
        retry();
        return -1;
    }
    *d = (const unsigned char *)b->db.buf + start;
    *n = (Py_ssize_t)(end - start);
    *g = gi;
    return 0;
}

/* -- decode_arrow's growable buffers ---------------------------------------------------------
 * A buffer is addressed by row (fixed width: values, lengths, validity) or appended to (the
 * data of strings and bytes). Rows never written read as zero: growth zero-fills. `count` is
 * the next element row of a repeat (kept on the repeat's lengths buffer). */
typedef struct {
    unsigned char *p;
    Py_ssize_t len, cap, count;
} ABuf;

static int abuf_grow(ABuf *b, Py_ssize_t need)
{
    Py_ssize_t cap = b->cap ? b->cap : 256;
    unsigned char *p;
    while (cap < need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(p + b->cap, 0, (size_t)(cap - b->cap));
    b->p = p;
    b->cap = cap;
    return 0;
}

/* Row `row` of a fixed-width buffer (width 1, 4 or 8, native byte order) set to v. */
static inline int a_put(ABuf *b, Py_ssize_t row, unsigned long long v, int width)
{
    Py_ssize_t end = (row + 1) * width;
    if (end > b->cap && abuf_grow(b, end) < 0) return -1;
    if (width == 8) {
        memcpy(b->p + row * 8, &v, 8);
    } else if (width == 4) {
        unsigned int w = (unsigned int)v;
        memcpy(b->p + row * 4, &w, 4);
    } else {
        b->p[row] = (unsigned char)v;
    }
    if (end > b->len) b->len = end;
    return 0;
}

/* A string or bytes value: its length at `row` of lengths, its bytes appended to data. A value
 * Arrow's 32-bit offsets cannot hold is left to the Python code (Retry). */
static inline int a_var(ABuf *lengths, ABuf *data, Py_ssize_t row, const unsigned char *s,
                        Py_ssize_t size)
{
    if (size > 0x7fffffff) {
        PyErr_SetNone(Retry);
        return -1;
    }
    if (a_put(lengths, row, (unsigned long long)size, 4) < 0) return -1;
    if (data->len + size > data->cap && abuf_grow(data, data->len + size) < 0) return -1;
    memcpy(data->p + data->len, s, (size_t)size);
    data->len += size;
    return 0;
}

/* A block of `count` empty buffers. */
static ABuf *abufs_new(Py_ssize_t count)
{
    ABuf *bufs = PyMem_Calloc((size_t)count + 1, sizeof(ABuf));
    if (bufs == NULL) PyErr_NoMemory();
    return bufs;
}

static void abufs_free(ABuf *bufs, Py_ssize_t count)
{
    if (bufs == NULL) return;
    for (Py_ssize_t i = 0; i < count; i++) PyMem_Free(bufs[i].p);
    PyMem_Free(bufs);
}

/* The buffers as a list of bytes objects (each as long as its highest written row). */
static PyObject *abufs_list(ABuf *bufs, Py_ssize_t count)
{
    PyObject *out = PyList_New(count);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)bufs[i].p, bufs[i].len);
        if (b == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, b);
    }
    return out;
}

/* Whether s is strict UTF-8, as Python's decoder without an error handler takes it: no
 * overlong forms, no surrogates, nothing past U+10FFFF. */
static inline int utf8_valid(const unsigned char *s, Py_ssize_t size)
{
    const unsigned char *end = s + size;
    while (s < end) {
        if (end - s >= 8) {
            unsigned long long w;
            memcpy(&w, s, 8);
            if ((w & 0x8080808080808080ULL) == 0) {
                s += 8;
                continue;
            }
        }
        unsigned char c = *s;
        if (c < 0x80) {
            s++;
        } else if (c >= 0xC2 && c <= 0xDF) {
            if (end - s < 2 || (s[1] & 0xC0) != 0x80) return 0;
            s += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (end - s < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && s[1] < 0xA0) return 0;  /* overlong */
            if (c == 0xED && s[1] > 0x9F) return 0;  /* surrogate */
            s += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (end - s < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 ||
                (s[3] & 0xC0) != 0x80)
                return 0;
            if (c == 0xF0 && s[1] < 0x90) return 0;  /* overlong */
            if (c == 0xF4 && s[1] > 0x8F) return 0;  /* past U+10FFFF */
            s += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

#endif /* PGCDC_SPEEDUPS_H */
