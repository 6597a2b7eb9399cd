/* What the broker reads of every AMQP message it is sent, in C: `inspect`'s usual case.

   `Inspector(fallback)` is a callable with `AmqpMessageFormat._inspect`'s contract:
   called with a message's bytes, it gives (durable, priority, ttl, duplicate-id key or
   None). It reads messages laid out as clients send them: sections with the short
   descriptor (00 53 code), a header whose fields are the usual types, and application
   properties whose keys are str8 or sym8 and whose `_AMQ_DUPL_ID`, when present, is a
   vbin8 or an ASCII str8. Anything else (a malformed message included) goes to
   `fallback`, the Python implementation, which decides and words any error, so the two
   answer alike wherever this one answers. The key of an id is its encoding (constructor,
   length, bytes): a slice of the message.

   The module is optional: without a C compiler the package installs without it, and
   the Python implementation runs alone (protocols/amqp/format.py). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>

#define DECLINE 1 /* not a case read here: the fallback decides */

static const char ID_NAME[] = "_AMQ_DUPL_ID";
#define ID_NAME_SIZE (sizeof(ID_NAME) - 1)

/* (False, 4, 0, None): a message without a header or an id; shared, as Python's. */
static PyObject *defaults;

static inline uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Advance *at past the encoded value there (not a described one); DECLINE when the
   constructor is not a primitive one or the value runs past `n`. */
static int
skip_value(const unsigned char *d, Py_ssize_t n, Py_ssize_t *at)
{
    Py_ssize_t p = *at, size;
    if (p >= n)
        return DECLINE;
    unsigned char code = d[p++];
    switch (code) {
    case 0x40: case 0x41: case 0x42: case 0x43: case 0x44: case 0x45:
        size = 0;
        break;
    case 0x50: case 0x51: case 0x52: case 0x53: case 0x54: case 0x55: case 0x56:
        size = 1;
        break;
    case 0x60: case 0x61:
        size = 2;
        break;
    case 0x70: case 0x71: case 0x72: case 0x73: case 0x74:
        size = 4;
        break;
    case 0x80: case 0x81: case 0x82: case 0x83: case 0x84:
        size = 8;
        break;
    case 0x94: case 0x98:
        size = 16;
        break;
    case 0xA0: case 0xA1: case 0xA3: case 0xC0: case 0xC1: case 0xE0:
        if (p >= n)
            return DECLINE;
        size = 1 + (Py_ssize_t)d[p];
        break;
    case 0xB0: case 0xB1: case 0xB3: case 0xD0: case 0xD1: case 0xF0:
        if (p + 4 > n)
            return DECLINE;
        size = 4 + (Py_ssize_t)be32(d + p);
        break;
    default:
        return DECLINE;
    }
    if (size > n - p)
        return DECLINE;
    *at = p + size;
    return 0;
}

/* The list or map at *at (`code8`: its 8-bit constructor, list8 or map8; code8 + 0x10
   the 32-bit one): its element count, its end, and *at at its first element. */
static int
compound(const unsigned char *d, Py_ssize_t n, unsigned char code8, Py_ssize_t *at,
         Py_ssize_t *end, uint32_t *count)
{
    Py_ssize_t p = *at;
    if (p + 3 <= n && d[p] == code8) {
        *end = p + 2 + d[p + 1];
        *count = d[p + 2];
        *at = p + 3;
    } else if (p + 9 <= n && d[p] == code8 + 0x10) {
        *end = p + 5 + (Py_ssize_t)be32(d + p + 1);
        *count = be32(d + p + 5);
        *at = p + 9;
    } else {
        return DECLINE;
    }
    return *end > n ? DECLINE : 0;
}

/* A header boolean (durable, first-acquirer): null, true, false or boolean 0/1. */
static int
read_bool(const unsigned char *d, Py_ssize_t end, Py_ssize_t *at, int *value)
{
    Py_ssize_t p = *at;
    switch (d[p]) {
    case 0x40: case 0x42:
        *value = 0;
        *at = p + 1;
        return 0;
    case 0x41:
        *value = 1;
        *at = p + 1;
        return 0;
    case 0x56:
        if (p + 2 > end || d[p + 1] > 1)
            return DECLINE;
        *value = d[p + 1];
        *at = p + 2;
        return 0;
    }
    return DECLINE;
}

/* A header uint (ttl, delivery-count): null (0), uint0, smalluint or uint. */
static int
read_uint(const unsigned char *d, Py_ssize_t end, Py_ssize_t *at, uint32_t *value)
{
    Py_ssize_t p = *at;
    switch (d[p]) {
    case 0x40: case 0x43:
        *value = 0;
        *at = p + 1;
        return 0;
    case 0x52:
        if (p + 2 > end)
            return DECLINE;
        *value = d[p + 1];
        *at = p + 2;
        return 0;
    case 0x70:
        if (p + 5 > end)
            return DECLINE;
        *value = be32(d + p + 1);
        *at = p + 5;
        return 0;
    }
    return DECLINE;
}

/* The header's value (a list) at *at: its durable, priority and ttl; *at past it. */
static int
read_header(const unsigned char *d, Py_ssize_t n, Py_ssize_t *at, int *durable,
            unsigned *priority, uint32_t *ttl)
{
    Py_ssize_t p = *at, end;
    uint32_t count, i;
    if (p >= n)
        return DECLINE;
    if (d[p] == 0x45) { /* list0 */
        *at = p + 1;
        return 0;
    }
    if (compound(d, n, 0xC0, &p, &end, &count))
        return DECLINE;
    for (i = 0; i < count; i++) {
        int flag;
        uint32_t number;
        if (p >= end)
            return DECLINE;
        switch (i) {
        case 0:
            if (read_bool(d, end, &p, durable))
                return DECLINE;
            break;
        case 1:
            if (d[p] == 0x40) {
                p += 1;
            } else if (d[p] == 0x50 && p + 2 <= end) {
                *priority = d[p + 1];
                p += 2;
            } else {
                return DECLINE;
            }
            break;
        case 2:
            if (read_uint(d, end, &p, ttl))
                return DECLINE;
            break;
        case 3:
            if (read_bool(d, end, &p, &flag))
                return DECLINE;
            break;
        case 4:
            if (read_uint(d, end, &p, &number))
                return DECLINE;
            break;
        default:
            if (skip_value(d, end, &p))
                return DECLINE;
        }
    }
    if (p != end)
        return DECLINE;
    *at = end;
    return 0;
}

/* The duplicate id in the application-properties map at *at: *key_at and *key_end
   bound its encoding (both 0: the map has none). */
static int
find_id(const unsigned char *d, Py_ssize_t n, Py_ssize_t at, Py_ssize_t *key_at,
        Py_ssize_t *key_end)
{
    Py_ssize_t p = at, end;
    uint32_t count, i;
    if (compound(d, n, 0xC1, &p, &end, &count) || count & 1)
        return DECLINE;
    for (i = 0; i < count / 2; i++) {
        Py_ssize_t name, size;
        if (p + 2 > end || (d[p] != 0xA1 && d[p] != 0xA3))
            return DECLINE;
        size = d[p + 1];
        name = p + 2;
        p = name + size;
        if (p >= end)
            return DECLINE;
        if (size == ID_NAME_SIZE && memcmp(d + name, ID_NAME, ID_NAME_SIZE) == 0) {
            Py_ssize_t stop, j;
            if (p + 2 > end || (d[p] != 0xA0 && d[p] != 0xA1))
                return DECLINE;
            stop = p + 2 + d[p + 1];
            if (stop > end)
                return DECLINE;
            if (d[p] == 0xA1) /* a string: its UTF-8 checked by the fallback unless ASCII */
                for (j = p + 2; j < stop; j++)
                    if (d[j] & 0x80)
                        return DECLINE;
            *key_at = p;
            *key_end = stop;
            return 0;
        }
        if (skip_value(d, end, &p))
            return DECLINE;
    }
    *key_at = *key_end = 0;
    return 0;
}

static PyObject *
inspect(PyObject *data)
{
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data), p = 0, key_at = 0, key_end = 0;
    int durable = 0;
    unsigned priority = 4;
    uint32_t ttl = 0;

    if (n < 3 || d[0] != 0x00 || d[1] != 0x53)
        return NULL;
    if (d[2] >= 0x75 && d[2] <= 0x77) /* begins with its body: nothing before it */
        return Py_NewRef(defaults);
    if (d[2] == 0x70) {
        p = 3;
        if (read_header(d, n, &p, &durable, &priority, &ttl))
            return NULL;
    }
    while (p < n) {
        Py_ssize_t code;
        if (p + 3 > n || d[p] != 0x00 || d[p + 1] != 0x53)
            return NULL;
        code = d[p + 2];
        p += 3;
        if (code == 0x74) {
            if (find_id(d, n, p, &key_at, &key_end))
                return NULL;
            break;
        }
        if (code > 0x74) /* the body: no application properties */
            break;
        if (code < 0x70) /* not a section: the fallback says what */
            return NULL;
        if (skip_value(d, n, &p))
            return NULL;
    }
    if (!durable && priority == 4 && ttl == 0 && key_end == 0)
        return Py_NewRef(defaults);
    PyObject *key = key_end ? PyBytes_FromStringAndSize((const char *)d + key_at,
                                                        key_end - key_at)
                            : Py_NewRef(Py_None);
    if (key == NULL)
        return NULL;
    PyObject *result = PyTuple_New(4);
    if (result == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    PyTuple_SET_ITEM(result, 0, PyBool_FromLong(durable));
    PyTuple_SET_ITEM(result, 1, PyLong_FromUnsignedLong(priority));
    PyTuple_SET_ITEM(result, 2, PyLong_FromUnsignedLong(ttl));
    PyTuple_SET_ITEM(result, 3, key);
    if (PyTuple_GET_ITEM(result, 1) == NULL || PyTuple_GET_ITEM(result, 2) == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

typedef struct {
    PyObject_HEAD
    PyObject *fallback;
    vectorcallfunc vectorcall;
} Inspector;

static PyObject *
Inspector_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Inspector *inspector = (Inspector *)self;
    if (PyVectorcall_NARGS(nargsf) == 1 && kwnames == NULL && PyBytes_CheckExact(args[0])) {
        PyObject *header = inspect(args[0]);
        if (header != NULL || PyErr_Occurred())
            return header;
    }
    return PyObject_Vectorcall(inspector->fallback, args, nargsf, kwnames);
}

static PyObject *
Inspector_new(PyTypeObject *type, PyObject *args, PyObject *Py_UNUSED(kwargs))
{
    PyObject *fallback;
    if (!PyArg_ParseTuple(args, "O:Inspector", &fallback))
        return NULL;
    if (!PyCallable_Check(fallback)) {
        PyErr_Format(PyExc_TypeError, "Inspector(fallback): fallback must be callable, not %s",
                     Py_TYPE(fallback)->tp_name);
        return NULL;
    }
    Inspector *self = (Inspector *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->fallback = Py_NewRef(fallback);
    self->vectorcall = Inspector_vectorcall;
    return (PyObject *)self;
}

static int
Inspector_traverse(Inspector *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fallback);
    return 0;
}

static int
Inspector_clear(Inspector *self)
{
    Py_CLEAR(self->fallback);
    return 0;
}

static void
Inspector_dealloc(Inspector *self)
{
    PyObject_GC_UnTrack(self);
    Inspector_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject InspectorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "scow.protocols.amqp._speedups.Inspector",
    .tp_doc = PyDoc_STR("Inspector(fallback): `inspect` in C for the usual message "
                        "layouts, `fallback(data)` for any other."),
    .tp_basicsize = sizeof(Inspector),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = Inspector_new,
    .tp_vectorcall_offset = offsetof(Inspector, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_traverse = (traverseproc)Inspector_traverse,
    .tp_clear = (inquiry)Inspector_clear,
    .tp_dealloc = (destructor)Inspector_dealloc,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "scow.protocols.amqp._speedups",
    .m_doc = PyDoc_STR("The AMQP message inspection of the broker's hot path, in C."),
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *m;
    if (PyType_Ready(&InspectorType) < 0)
        return NULL;
    defaults = Py_BuildValue("(OiiO)", Py_False, 4, 0, Py_None);
    if (defaults == NULL)
        return NULL;
    m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Inspector", (PyObject *)&InspectorType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
