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

#endif /* PGCDC_SPEEDUPS_H */
