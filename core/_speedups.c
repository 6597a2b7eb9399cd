/* The duplicate-id check of the broker's hot path, in C: `IdGenerations`, the base of
   `DuplicateIdCache` (core/duplicates.py, which says what the generations and the open
   block are). It holds the two generations (dicts), a filter of each, the open block
   (a list or None) and the size, and answers the two questions every message with an
   id asks: whether the cache holds it (`key in cache`: mostly from the filters alone,
   as most ids are new) and, once it is accepted, its admission (`admit`), whose usual
   case (the open block has room in the young generation) it makes itself; any other it
   leaves to the subclass's `_admit`. The generations change only through its methods
   (`_add`, `_age_generations`, `_clear_generations`), besides ids deleted from the old
   one; a generation changed otherwise is read whole, never misread.

   The module is optional: without a C compiler the package installs without it, and
   duplicates.py's Python build of the same class (`PyIdGenerations`) runs. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

/* A generation's filter (a blocked Bloom filter: one 64-bit word per key, three bits of
   it): most ids a message carries are new, and telling so from a dict of 20,000 ids
   reads memory the rest of the broker's work has pushed out of the CPU's caches (two
   or three misses per generation); this filter, 16 bits per id, stays in them. */
typedef struct {
    uint64_t *words;
    uint64_t mask; /* words - 1, a power of two less one */
} Filter;

static int
filter_init(Filter *filter, Py_ssize_t size)
{
    uint64_t words = 1;
    while (words < (uint64_t)size / 4 && words < ((uint64_t)1 << 26))
        words <<= 1;
    uint64_t *fresh = PyMem_Calloc(words, sizeof(uint64_t));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(filter->words);
    filter->words = fresh;
    filter->mask = words - 1;
    return 0;
}

static inline uint64_t
filter_bits(uint64_t hash)
{
    return ((uint64_t)1 << ((hash >> 40) & 63)) | ((uint64_t)1 << ((hash >> 46) & 63))
           | ((uint64_t)1 << ((hash >> 52) & 63));
}

static inline void
filter_add(Filter *filter, uint64_t hash)
{
    filter->words[hash & filter->mask] |= filter_bits(hash);
}

static inline int
filter_may_hold(const Filter *filter, uint64_t hash)
{
    uint64_t bits = filter_bits(hash);
    return (filter->words[hash & filter->mask] & bits) == bits;
}

typedef struct {
    PyObject_HEAD
    PyObject *young;
    PyObject *old;
    PyObject *open;
    Py_ssize_t size;
    int journaled;
    Filter young_filter;
    Filter old_filter;
    /* The size of each generation when its filter last held every id of it: a filter
       is used only while its generation has that size (young) or less (old, whose ids
       `add_block` may move out): a dict changed behind the filter's back is read
       whole. */
    Py_ssize_t young_filtered;
    Py_ssize_t old_filtered;
} IdGenerations;

static int
IdGenerations_init(IdGenerations *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"size", "journaled", NULL};
    Py_ssize_t size;
    int journaled = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|$p:IdGenerations", names, &size,
                                     &journaled))
        return -1;
    Py_XSETREF(self->young, PyDict_New());
    Py_XSETREF(self->old, PyDict_New());
    if (self->young == NULL || self->old == NULL)
        return -1;
    if (filter_init(&self->young_filter, size) < 0 || filter_init(&self->old_filter, size) < 0)
        return -1;
    self->young_filtered = self->old_filtered = 0;
    Py_XSETREF(self->open, Py_NewRef(Py_None));
    self->size = size;
    self->journaled = journaled;
    return 0;
}

static int
initialized(IdGenerations *self)
{
    if (self->young == NULL || self->old == NULL) {
        PyErr_SetString(PyExc_AttributeError, "IdGenerations: __init__ was not called");
        return 0;
    }
    return 1;
}

static int
IdGenerations_contains(IdGenerations *self, PyObject *key)
{
    if (!initialized(self))
        return -1;
    Py_hash_t hash = PyObject_Hash(key);
    if (hash == -1)
        return -1;
    if (PyDict_GET_SIZE(self->young) != self->young_filtered
        || filter_may_hold(&self->young_filter, (uint64_t)hash)) {
        int found = PyDict_Contains(self->young, key);
        if (found)
            return found;
    }
    if (PyDict_GET_SIZE(self->old) > self->old_filtered
        || filter_may_hold(&self->old_filter, (uint64_t)hash))
        return PyDict_Contains(self->old, key);
    return 0;
}

static Py_ssize_t
IdGenerations_length(IdGenerations *self)
{
    if (!initialized(self))
        return -1;
    return PyDict_GET_SIZE(self->young) + PyDict_GET_SIZE(self->old);
}

/* young[key] = None, and into its filter */
static int
add(IdGenerations *self, PyObject *key)
{
    Py_hash_t hash = PyObject_Hash(key);
    if (hash == -1)
        return -1;
    int filtered = PyDict_GET_SIZE(self->young) == self->young_filtered;
    if (PyDict_SetItem(self->young, key, Py_None) < 0)
        return -1;
    filter_add(&self->young_filter, (uint64_t)hash);
    if (filtered)
        self->young_filtered = PyDict_GET_SIZE(self->young);
    return 0;
}

static PyObject *
IdGenerations_add(IdGenerations *self, PyObject *key)
{
    if (!initialized(self) || add(self, key) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
IdGenerations_admit(IdGenerations *self, PyObject *key)
{
    PyObject *open = self->open;
    if (!initialized(self))
        return NULL;
    if (open != NULL && PyList_CheckExact(open) && PyDict_GET_SIZE(self->young) < self->size) {
        if (add(self, key) < 0 || PyList_Append(open, key) < 0)
            return NULL;
        Py_RETURN_FALSE;
    }
    return PyObject_CallMethod((PyObject *)self, "_admit", "O", key);
}

static PyObject *
IdGenerations_age_generations(IdGenerations *self, PyObject *Py_UNUSED(ignored))
{
    if (!initialized(self))
        return NULL;
    /* sized for the ids the generation that filled held: no growth by doubling (the
       presizing call is CPython's own, private from 3.13 on) */
#if PY_VERSION_HEX < 0x030D0000
    PyObject *young = _PyDict_NewPresized(self->size);
#else
    PyObject *young = PyDict_New();
#endif
    if (young == NULL)
        return NULL;
    /* the old filter, cleared and sized for the size now, is the young one's */
    Filter filter = self->old_filter;
    self->old_filter = self->young_filter;
    self->young_filter = filter;
    if (filter_init(&self->young_filter, self->size) < 0) {
        Py_DECREF(young);
        return NULL;
    }
    PyObject *dropped = self->old;
    self->old = self->young;
    self->young = young;
    self->old_filtered = self->young_filtered;
    self->young_filtered = 0;
    Py_DECREF(dropped);
    Py_RETURN_NONE;
}

static PyObject *
IdGenerations_clear_generations(IdGenerations *self, PyObject *Py_UNUSED(ignored))
{
    if (!initialized(self))
        return NULL;
    PyDict_Clear(self->young);
    PyDict_Clear(self->old);
    memset(self->young_filter.words, 0, (self->young_filter.mask + 1) * sizeof(uint64_t));
    memset(self->old_filter.words, 0, (self->old_filter.mask + 1) * sizeof(uint64_t));
    self->young_filtered = self->old_filtered = 0;
    Py_RETURN_NONE;
}

static int
IdGenerations_traverse(IdGenerations *self, visitproc visit, void *arg)
{
    Py_VISIT(self->young);
    Py_VISIT(self->old);
    Py_VISIT(self->open);
    return 0;
}

static int
IdGenerations_clear(IdGenerations *self)
{
    Py_CLEAR(self->young);
    Py_CLEAR(self->old);
    Py_CLEAR(self->open);
    return 0;
}

static void
IdGenerations_dealloc(IdGenerations *self)
{
    /* a subclass's instance: its own dealloc untracks it and releases its type */
    PyObject_GC_UnTrack(self);
    IdGenerations_clear(self);
    PyMem_Free(self->young_filter.words);
    PyMem_Free(self->old_filter.words);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef members[] = {
    {"young", T_OBJECT_EX, offsetof(IdGenerations, young), READONLY,
     "The ids admitted since the young generation began (a dict of them, to read: "
     "changed by the methods only)."},
    {"old", T_OBJECT_EX, offsetof(IdGenerations, old), READONLY,
     "The generation before it (a dict, to read: `add_block` may delete from it)."},
    {"open", T_OBJECT, offsetof(IdGenerations, open), 0,
     "The ids admitted on their own since the open block's last close (None: none)."},
    {"size", T_PYSSIZET, offsetof(IdGenerations, size), 0, "A generation's ids, at most."},
    {"journaled", T_BOOL, offsetof(IdGenerations, journaled), 0,
     "Whether the cache's blocks are journaled."},
    {NULL},
};

static PyMethodDef methods[] = {
    {"admit", (PyCFunction)IdGenerations_admit, METH_O,
     PyDoc_STR("admit(key): admit `key` (newest, not in the cache) into the open block; "
               "True when this opened the block, so that a close is due.")},
    {"_add", (PyCFunction)IdGenerations_add, METH_O,
     PyDoc_STR("_add(key): put `key` in the young generation.")},
    {"_age_generations", (PyCFunction)IdGenerations_age_generations, METH_NOARGS,
     PyDoc_STR("_age_generations(): the young generation becomes the old one, whose ids "
               "are dropped; a new young one begins.")},
    {"_clear_generations", (PyCFunction)IdGenerations_clear_generations, METH_NOARGS,
     PyDoc_STR("_clear_generations(): forget every id.")},
    {NULL},
};

static PySequenceMethods as_sequence = {
    .sq_length = (lenfunc)IdGenerations_length,
    .sq_contains = (objobjproc)IdGenerations_contains,
};

static PyTypeObject IdGenerationsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "scow.core._speedups.IdGenerations",
    .tp_doc = PyDoc_STR("IdGenerations(size, *, journaled=True): a duplicate-id cache's "
                        "generations, its open block and its size."),
    .tp_basicsize = sizeof(IdGenerations),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)IdGenerations_init,
    .tp_traverse = (traverseproc)IdGenerations_traverse,
    .tp_clear = (inquiry)IdGenerations_clear,
    .tp_dealloc = (destructor)IdGenerations_dealloc,
    .tp_members = members,
    .tp_methods = methods,
    .tp_as_sequence = &as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "scow.core._speedups",
    .m_doc = PyDoc_STR("The duplicate-id check of the broker's hot path, in C."),
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&IdGenerationsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "IdGenerations", (PyObject *)&IdGenerationsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
