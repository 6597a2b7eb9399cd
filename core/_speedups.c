/* The duplicate-id check of the broker's hot path, in C: `IdGenerations`, the base of
   `DuplicateIdCache` (core/duplicates.py, which says what the generations and the open
   block are). It holds the two generations (dicts), the open block (a list or None) and
   the size, and answers the two questions every message with an id asks: whether the
   cache holds it (`key in cache`) and, once it is accepted, its admission (`admit`),
   whose usual case (the open block has room in the young generation) it makes itself;
   any other it leaves to the subclass's `_admit`.

   The module is optional: without a C compiler the package installs without it, and
   duplicates.py's Python build of the same class runs. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *young;
    PyObject *old;
    PyObject *open;
    Py_ssize_t size;
    int journaled;
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
    Py_XSETREF(self->open, Py_NewRef(Py_None));
    self->size = size;
    self->journaled = journaled;
    return 0;
}

static int
generation_holds(PyObject *generation, PyObject *key)
{
    if (generation == NULL) {
        PyErr_SetString(PyExc_AttributeError, "IdGenerations: a generation is not set");
        return -1;
    }
    return PySequence_Contains(generation, key);
}

static int
IdGenerations_contains(IdGenerations *self, PyObject *key)
{
    int found = generation_holds(self->young, key);
    return found ? found : generation_holds(self->old, key);
}

static Py_ssize_t
IdGenerations_length(IdGenerations *self)
{
    if (self->young == NULL || self->old == NULL) {
        PyErr_SetString(PyExc_AttributeError, "IdGenerations: a generation is not set");
        return -1;
    }
    Py_ssize_t young = PyObject_Size(self->young);
    if (young < 0)
        return -1;
    Py_ssize_t old = PyObject_Size(self->old);
    return old < 0 ? -1 : young + old;
}

static PyObject *
IdGenerations_admit(IdGenerations *self, PyObject *key)
{
    PyObject *young = self->young, *open = self->open;
    if (young != NULL && PyDict_CheckExact(young) && open != NULL && PyList_CheckExact(open)
        && PyDict_GET_SIZE(young) < self->size) {
        if (PyDict_SetItem(young, key, Py_None) < 0 || PyList_Append(open, key) < 0)
            return NULL;
        Py_RETURN_FALSE;
    }
    return PyObject_CallMethod((PyObject *)self, "_admit", "O", key);
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
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef members[] = {
    {"young", T_OBJECT_EX, offsetof(IdGenerations, young), 0,
     "The ids admitted since the young generation began (a dict of them)."},
    {"old", T_OBJECT_EX, offsetof(IdGenerations, old), 0, "The generation before it."},
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
