/* The duplicate-id check of the broker's hot path, in C: `IdGenerations`, the base of
   `DuplicateIdCache` (core/duplicates.py, which says what the generations and the open
   block are). It holds the two generations (`IdGeneration`: a table of its own, below),
   the open block (a bytearray of keys back to back, or None) and the size, and answers
   what every message with an id asks: whether the cache holds it and, if not, its
   admission (`admit_new`; `in` and `admit` apart), whose usual case (room in the young
   generation, the open block open) it makes itself; any other it leaves to the
   subclass's `_admit`.

   The module is optional: without a C compiler the package installs without it, and
   duplicates.py's Python build of the same class (`PyIdGenerations`, whose generations
   are dicts) runs. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

/* ---------------------------------------------------------------- a generation

   An `IdGeneration` holds its keys packed one after another in an arena, in the order
   they came, and an open-addressing index of them. A dict of 20,000 keys is 20,000
   objects of 64 bytes that live for 20,000-40,000 messages, plus its own table, and
   dropping it frees them one by one: about 1.3 MiB per generation, which the rest of
   the broker's work keeps pushing out of the CPU's caches. Here a key costs its bytes,
   12 bytes of header and 8 of entry, its index slot 8 bytes with a tag of its hash, and
   a generation is dropped by resetting it. A message's new id reads one index slot per
   generation (the tag tells a miss without reading the key) and, admitted, writes to
   the ends of the arena and the entries. */

/* an arena record: the key's hash (8 bytes), its length (4), its bytes */
#define HEAD 12
/* an entry's flag: its key was removed (`pop`, `withdraw`) */
#define DEAD ((uint64_t)1 << 63)

typedef struct {
    PyObject_HEAD
    char *arena;
    size_t used, room;
    /* each key's arena offset, in the order they came (DEAD once removed) */
    uint64_t *entries;
    size_t count, entries_room;
    /* keys held: entries not DEAD */
    Py_ssize_t live;
    /* 0: empty; otherwise the hash's high 32 bits, then the entry's index + 1 */
    uint64_t *slots;
    size_t mask;
    /* slots in use (a removed key's stays, unless it came last) */
    size_t indexed;
} IdGeneration;

static PyTypeObject IdGenerationType;

/* the index's size for `keys`: a power of two, at most 3/4 full */
static size_t
index_size(size_t keys)
{
    size_t size = 8;
    while (size / 4 * 3 < keys)
        size <<= 1;
    return size;
}

static inline uint32_t
tag_of(Py_hash_t hash)
{
    return (uint32_t)((uint64_t)hash >> 32);
}

static inline const char *
record_at(const IdGeneration *g, size_t entry)
{
    return g->arena + (g->entries[entry] & ~DEAD);
}

static inline int
record_is(const char *record, const char *key, uint32_t length)
{
    uint32_t held;
    memcpy(&held, record + 8, 4);
    return held == length && memcmp(record + HEAD, key, length) == 0;
}

/* The entry holding `key` (-1: none); `*slot` is its index slot, or the empty one
   where it would go. */
static Py_ssize_t
find(const IdGeneration *g, const char *key, uint32_t length, Py_hash_t hash, size_t *slot)
{
    uint64_t tag = (uint64_t)tag_of(hash) << 32;
    size_t at = (size_t)hash & g->mask;
    for (;;) {
        uint64_t held = g->slots[at];
        if (held == 0) {
            *slot = at;
            return -1;
        }
        if ((held & 0xFFFFFFFF00000000u) == tag) {
            size_t entry = (size_t)(held & 0xFFFFFFFFu) - 1;
            if (!(g->entries[entry] & DEAD) && record_is(record_at(g, entry), key, length)) {
                *slot = at;
                return (Py_ssize_t)entry;
            }
        }
        at = (at + 1) & g->mask;
    }
}

static void
index_entry(IdGeneration *g, size_t entry)
{
    Py_hash_t hash;
    memcpy(&hash, record_at(g, entry), 8);
    size_t at = (size_t)hash & g->mask;
    while (g->slots[at] != 0)
        at = (at + 1) & g->mask;
    g->slots[at] = ((uint64_t)tag_of(hash) << 32) | (uint64_t)(entry + 1);
}

/* A new index of `size` slots holding the keys held (not the removed ones). */
static int
reindex(IdGeneration *g, size_t size)
{
    uint64_t *slots = PyMem_Calloc(size, sizeof(uint64_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(g->slots);
    g->slots = slots;
    g->mask = size - 1;
    for (size_t entry = 0; entry < g->count; entry++)
        if (!(g->entries[entry] & DEAD))
            index_entry(g, entry);
    g->indexed = (size_t)g->live;
    return 0;
}

static int
grow(void **block, size_t *room, size_t needed, size_t unit)
{
    if (needed <= *room)
        return 0;
    size_t fresh = *room ? *room : 64;
    while (fresh < needed)
        fresh *= 2;
    void *grown = PyMem_Realloc(*block, fresh * unit);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *block = grown;
    *room = fresh;
    return 0;
}

/* An empty generation presized for `expected` keys of 32 bytes. */
static IdGeneration *
generation_new(Py_ssize_t expected)
{
    IdGeneration *g = PyObject_New(IdGeneration, &IdGenerationType);
    if (g == NULL)
        return NULL;
    g->arena = NULL;
    g->entries = NULL;
    g->slots = NULL;
    g->used = g->room = g->count = g->entries_room = g->indexed = 0;
    g->live = 0;
    size_t keys = expected > 0 ? (size_t)expected : 0;
    if (grow((void **)&g->arena, &g->room, keys * (HEAD + 20), 1) < 0
        || grow((void **)&g->entries, &g->entries_room, keys, sizeof(uint64_t)) < 0
        || reindex(g, index_size(keys)) < 0) {
        Py_DECREF(g);
        return NULL;
    }
    return g;
}

/* Forget every key, the index sized for `expected`. */
static int
generation_reset(IdGeneration *g, Py_ssize_t expected)
{
    g->used = g->count = g->indexed = 0;
    g->live = 0;
    size_t size = index_size(expected > 0 ? (size_t)expected : 0);
    if (size != g->mask + 1)
        return reindex(g, size);
    memset(g->slots, 0, size * sizeof(uint64_t));
    return 0;
}

/* Make room in the index for one more key (before a `find` whose slot `add_at` fills). */
static int
generation_reserve(IdGeneration *g)
{
    if ((g->indexed + 1) > (g->mask + 1) / 4 * 3
        && reindex(g, index_size(2 * ((size_t)g->live + 1))) < 0)
        return -1;
    return 0;
}

/* Add `key`, not held, at the empty `slot` its `find` gave (after `generation_reserve`;
   the length checked): 0, or -1 on error. */
static int
generation_add_at(IdGeneration *g, const char *key, Py_ssize_t length, Py_hash_t hash,
                  size_t slot)
{
    size_t offset = g->used;
    if (grow((void **)&g->arena, &g->room, offset + HEAD + (size_t)length, 1) < 0
        || grow((void **)&g->entries, &g->entries_room, g->count + 1, sizeof(uint64_t)) < 0)
        return -1;
    uint32_t length32 = (uint32_t)length;
    memcpy(g->arena + offset, &hash, 8);
    memcpy(g->arena + offset + 8, &length32, 4);
    memcpy(g->arena + offset + HEAD, key, (size_t)length);
    g->used = offset + HEAD + (size_t)length;
    g->entries[g->count] = offset;
    g->count++;
    g->slots[slot] = ((uint64_t)tag_of(hash) << 32) | (uint64_t)g->count;
    g->indexed++;
    g->live++;
    return 0;
}

static int
key_fits(Py_ssize_t length)
{
    if (length > (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "IdGeneration: a key of over 4 GiB");
        return 0;
    }
    return 1;
}

/* Add `key` unless held: 1 when added, 0 when it was held already, -1 on error. */
static int
generation_add(IdGeneration *g, const char *key, Py_ssize_t length, Py_hash_t hash)
{
    size_t slot;
    if (!key_fits(length) || generation_reserve(g) < 0)
        return -1;
    if (find(g, key, (uint32_t)length, hash, &slot) >= 0)
        return 0;
    return generation_add_at(g, key, length, hash, slot) < 0 ? -1 : 1;
}

/* Remove `key`: 1 when it was held, 0 when not. The key that came last goes whole (a
   withdrawn admission); any other leaves its entry, marked, and its slot. */
static int
generation_remove(IdGeneration *g, const char *key, Py_ssize_t length, Py_hash_t hash)
{
    size_t slot;
    if (length > (Py_ssize_t)UINT32_MAX)
        return 0;
    Py_ssize_t entry = find(g, key, (uint32_t)length, hash, &slot);
    if (entry < 0)
        return 0;
    if ((size_t)entry == g->count - 1) {
        /* nothing came after it, so no probe passes its slot: emptied */
        g->slots[slot] = 0;
        g->used = (size_t)g->entries[entry];
        g->count--;
        g->indexed--;
    }
    else {
        g->entries[entry] |= DEAD;
    }
    g->live--;
    return 1;
}

static inline int
generation_holds(const IdGeneration *g, const char *key, Py_ssize_t length, Py_hash_t hash)
{
    size_t slot;
    return length <= (Py_ssize_t)UINT32_MAX && find(g, key, (uint32_t)length, hash, &slot) >= 0;
}

/* A key given from Python: its bytes and hash (0), or -1 with TypeError unless it is
   bytes (an unhashable one raises as in a dict; `*other` is set for any other). */
static int
key_parts(PyObject *key, const char **bytes, Py_ssize_t *length, Py_hash_t *hash, int *other)
{
    *other = 0;
    if (!PyBytes_Check(key)) {
        if (PyObject_Hash(key) == -1)
            return -1;
        *other = 1;
        return 0;
    }
    *hash = PyObject_Hash(key);
    if (*hash == -1)
        return -1;
    *bytes = PyBytes_AS_STRING(key);
    *length = PyBytes_GET_SIZE(key);
    return 0;
}

static int
IdGeneration_contains(IdGeneration *g, PyObject *key)
{
    const char *bytes;
    Py_ssize_t length;
    Py_hash_t hash;
    int other;
    if (key_parts(key, &bytes, &length, &hash, &other) < 0)
        return -1;
    return !other && generation_holds(g, bytes, length, hash);
}

static Py_ssize_t
IdGeneration_length(IdGeneration *g)
{
    return g->live;
}

static PyObject *
IdGeneration_iter(IdGeneration *g)
{
    PyObject *keys = PyList_New(0);
    if (keys == NULL)
        return NULL;
    for (size_t entry = 0; entry < g->count; entry++) {
        if (g->entries[entry] & DEAD)
            continue;
        const char *record = record_at(g, entry);
        uint32_t length;
        memcpy(&length, record + 8, 4);
        PyObject *key = PyBytes_FromStringAndSize(record + HEAD, length);
        if (key == NULL || PyList_Append(keys, key) < 0) {
            Py_XDECREF(key);
            Py_DECREF(keys);
            return NULL;
        }
        Py_DECREF(key);
    }
    PyObject *iterator = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return iterator;
}

static PyObject *
IdGeneration_pop(IdGeneration *g, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "pop expected 1 or 2 arguments, got %zd", nargs);
        return NULL;
    }
    const char *bytes;
    Py_ssize_t length;
    Py_hash_t hash;
    int other;
    if (key_parts(args[0], &bytes, &length, &hash, &other) < 0)
        return NULL;
    if (!other && generation_remove(g, bytes, length, hash))
        Py_RETURN_NONE;
    if (nargs == 2)
        return Py_NewRef(args[1]);
    PyErr_SetObject(PyExc_KeyError, args[0]);
    return NULL;
}

static void
IdGeneration_dealloc(IdGeneration *g)
{
    PyMem_Free(g->arena);
    PyMem_Free(g->entries);
    PyMem_Free(g->slots);
    PyObject_Free(g);
}

static PyMethodDef generation_methods[] = {
    {"pop", (PyCFunction)(void (*)(void))IdGeneration_pop, METH_FASTCALL,
     PyDoc_STR("pop(key[, default]): remove `key`, giving None (as a dict whose values "
               "are None); `default`, or KeyError, when it is not held.")},
    {NULL},
};

static PySequenceMethods generation_as_sequence = {
    .sq_length = (lenfunc)IdGeneration_length,
    .sq_contains = (objobjproc)IdGeneration_contains,
};

static PyTypeObject IdGenerationType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "scow.core._speedups.IdGeneration",
    .tp_doc = PyDoc_STR("A generation of a duplicate-id cache: its keys (bytes) in the order "
                        "they came; read with `in`, `len` and iteration, changed by its "
                        "IdGenerations only (and `pop`)."),
    .tp_basicsize = sizeof(IdGeneration),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)IdGeneration_dealloc,
    .tp_iter = (getiterfunc)IdGeneration_iter,
    .tp_methods = generation_methods,
    .tp_as_sequence = &generation_as_sequence,
};

/* ---------------------------------------------------------------- the generations */

typedef struct {
    PyObject_HEAD
    IdGeneration *young;
    IdGeneration *old;
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
    Py_XSETREF(self->young, generation_new(size));
    Py_XSETREF(self->old, generation_new(size));
    if (self->young == NULL || self->old == NULL)
        return -1;
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
holds(IdGenerations *self, const char *bytes, Py_ssize_t length, Py_hash_t hash)
{
    return generation_holds(self->young, bytes, length, hash)
           || generation_holds(self->old, bytes, length, hash);
}

static int
IdGenerations_contains(IdGenerations *self, PyObject *key)
{
    const char *bytes;
    Py_ssize_t length;
    Py_hash_t hash;
    int other;
    if (!initialized(self) || key_parts(key, &bytes, &length, &hash, &other) < 0)
        return -1;
    return !other && holds(self, bytes, length, hash);
}

static Py_ssize_t
IdGenerations_length(IdGenerations *self)
{
    if (!initialized(self))
        return -1;
    return self->young->live + self->old->live;
}

/* the key of `admit`, `_add` or `withdraw`: bytes */
static int
bytes_key(PyObject *key, const char **bytes, Py_ssize_t *length, Py_hash_t *hash)
{
    if (!PyBytes_Check(key)) {
        PyErr_Format(PyExc_TypeError, "a duplicate-id key is bytes, not %.100s",
                     Py_TYPE(key)->tp_name);
        return -1;
    }
    return key_parts(key, bytes, length, hash, &(int){0});
}

/* `admit` once `key` (hashed) is known new: its usual case here, any other in `_admit`.
   `slot`, when not NULL, is the young generation's empty slot for it (its `find`). */
static PyObject *
admit(IdGenerations *self, PyObject *key, const char *bytes, Py_ssize_t length, Py_hash_t hash,
      const size_t *slot)
{
    PyObject *open = self->open;
    int block = PyByteArray_CheckExact(open);
    if (self->young->live < self->size && (block || (open == Py_None && !self->journaled))) {
        if ((slot ? generation_add_at(self->young, bytes, length, hash, *slot)
                  : generation_add(self->young, bytes, length, hash))
            < 0)
            return NULL;
        if (block) {
            Py_ssize_t end = PyByteArray_GET_SIZE(open);
            if (PyByteArray_Resize(open, end + length) < 0)
                return NULL;
            memcpy(PyByteArray_AS_STRING(open) + end, bytes, (size_t)length);
        }
        Py_RETURN_FALSE;
    }
    return PyObject_CallMethod((PyObject *)self, "_admit", "O", key);
}

static PyObject *
IdGenerations_admit(IdGenerations *self, PyObject *key)
{
    const char *bytes;
    Py_ssize_t length;
    Py_hash_t hash;
    if (!initialized(self) || bytes_key(key, &bytes, &length, &hash) < 0)
        return NULL;
    return admit(self, key, bytes, length, hash, NULL);
}

/* The young generation is probed once: the slot where it misses `key` is where it goes. */
static PyObject *
IdGenerations_admit_new(IdGenerations *self, PyObject *key)
{
    const char *bytes;
    Py_ssize_t length;
    Py_hash_t hash;
    size_t slot, other;
    if (!initialized(self) || bytes_key(key, &bytes, &length, &hash) < 0 || !key_fits(length)
        || generation_reserve(self->young) < 0)
        return NULL;
    if (find(self->young, bytes, (uint32_t)length, hash, &slot) >= 0
        || find(self->old, bytes, (uint32_t)length, hash, &other) >= 0)
        Py_RETURN_NONE;
    return admit(self, key, bytes, length, hash, &slot);
}

/* The bytes of the key at `key` (the AMQP encoding of a string or binary: its type code
   gives its length's size), of at most `room`; 0 when none starts there. */
static Py_ssize_t
key_size(const char *key, Py_ssize_t room)
{
    const unsigned char *at = (const unsigned char *)key;
    Py_ssize_t size = 0;
    if ((at[0] == 0xA0 || at[0] == 0xA1) && room >= 2)
        size = 2 + (Py_ssize_t)at[1];
    else if ((at[0] == 0xB0 || at[0] == 0xB1) && room >= 5)
        size = 5 + (Py_ssize_t)((uint32_t)at[1] << 24 | (uint32_t)at[2] << 16
                                | (uint32_t)at[3] << 8 | (uint32_t)at[4]);
    return size <= room ? size : 0;
}

static PyObject *
IdGenerations_withdraw(IdGenerations *self, PyObject *key)
{
    const char *bytes;
    Py_ssize_t length;
    Py_hash_t hash;
    if (!initialized(self) || bytes_key(key, &bytes, &length, &hash) < 0)
        return NULL;
    generation_remove(self->young, bytes, length, hash);
    PyObject *open = self->open;
    if (PyByteArray_CheckExact(open)) {
        char *block = PyByteArray_AS_STRING(open);
        Py_ssize_t end = PyByteArray_GET_SIZE(open), size;
        for (Py_ssize_t at = 0; at < end && (size = key_size(block + at, end - at)) > 0;
             at += size) {
            if (size == length && memcmp(block + at, bytes, (size_t)length) == 0) {
                memmove(block + at, block + at + size, (size_t)(end - at - size));
                return PyByteArray_Resize(open, end - size) < 0 ? NULL : Py_NewRef(Py_None);
            }
        }
    }
    Py_RETURN_NONE;
}

static PyObject *
IdGenerations_add(IdGenerations *self, PyObject *key)
{
    const char *bytes;
    Py_ssize_t length;
    Py_hash_t hash;
    if (!initialized(self) || bytes_key(key, &bytes, &length, &hash) < 0
        || generation_add(self->young, bytes, length, hash) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
IdGenerations_age_generations(IdGenerations *self, PyObject *Py_UNUSED(ignored))
{
    if (!initialized(self))
        return NULL;
    /* the old generation, emptied, is the young one */
    if (generation_reset(self->old, self->size) < 0)
        return NULL;
    IdGeneration *young = self->old;
    self->old = self->young;
    self->young = young;
    Py_RETURN_NONE;
}

static PyObject *
IdGenerations_clear_generations(IdGenerations *self, PyObject *Py_UNUSED(ignored))
{
    if (!initialized(self) || generation_reset(self->young, self->size) < 0
        || generation_reset(self->old, self->size) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int
IdGenerations_traverse(IdGenerations *self, visitproc visit, void *arg)
{
    Py_VISIT(self->open);
    return 0;
}

static int
IdGenerations_clear(IdGenerations *self)
{
    Py_CLEAR(self->open);
    return 0;
}

static void
IdGenerations_dealloc(IdGenerations *self)
{
    /* a subclass's instance: its own dealloc untracks it and releases its type */
    PyObject_GC_UnTrack(self);
    IdGenerations_clear(self);
    Py_CLEAR(self->young);
    Py_CLEAR(self->old);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef members[] = {
    {"young", T_OBJECT_EX, offsetof(IdGenerations, young), READONLY,
     "The ids admitted since the young generation began (an IdGeneration)."},
    {"old", T_OBJECT_EX, offsetof(IdGenerations, old), READONLY,
     "The generation before it (`add_block` may pop ids from it)."},
    {"open", T_OBJECT, offsetof(IdGenerations, open), 0,
     "The keys admitted on their own since the open block's last close, back to back "
     "(a bytearray; None: none)."},
    {"size", T_PYSSIZET, offsetof(IdGenerations, size), 0, "A generation's ids, at most."},
    {"journaled", T_BOOL, offsetof(IdGenerations, journaled), 0,
     "Whether the cache's blocks are journaled."},
    {NULL},
};

static PyMethodDef methods[] = {
    {"admit", (PyCFunction)IdGenerations_admit, METH_O,
     PyDoc_STR("admit(key): admit `key` (newest, not in the cache) into the open block; "
               "True when this opened the block, so that a close is due.")},
    {"admit_new", (PyCFunction)IdGenerations_admit_new, METH_O,
     PyDoc_STR("admit_new(key): None when the cache holds `key`; otherwise admit it, "
               "as admit.")},
    {"withdraw", (PyCFunction)IdGenerations_withdraw, METH_O,
     PyDoc_STR("withdraw(key): undo the admission of `key` just made (its send was "
               "refused).")},
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
    if (PyType_Ready(&IdGenerationType) < 0 || PyType_Ready(&IdGenerationsType) < 0)
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
