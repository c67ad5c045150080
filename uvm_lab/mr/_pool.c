/* The pool, compiled: its free list (BestFit) and its allocate/deallocate hot path (HotPath).
 *
 * BestFit follows the same best-fit, coalescing rules as uvm_lab.mr.bestfit.PyBestFit.
 * Free ranges are kept twice, in two sorted arrays of (key, value) pairs: by (size, address) for the
 * best-fit search, and by (address, size) to find a freed range's neighbours. Block starts are a
 * third sorted array: ranges never merge across them. Searches are binary; inserts and removals move
 * the tail of an array, which for the tens to thousands of free ranges of a pool is cheaper than any tree.
 * The caller (PoolMemoryResource) holds its lock around every call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    uint64_t a, b;
} pair_t;

typedef struct {
    pair_t *items;
    Py_ssize_t n, cap;
} pairs_t;

typedef struct {
    PyObject_HEAD
    pairs_t by_size;     /* (size, address) */
    pairs_t by_addr;     /* (address, size) */
    uint64_t *blocks;    /* sorted block starts */
    Py_ssize_t nblocks, cblocks;
    uint64_t free_bytes;
} BestFit;

static Py_ssize_t lower_bound(const pairs_t *p, uint64_t a, uint64_t b) {
    Py_ssize_t lo = 0, hi = p->n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        const pair_t *m = &p->items[mid];
        if (m->a < a || (m->a == a && m->b < b)) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static int reserve(pairs_t *p) {
    if (p->n < p->cap) return 0;
    Py_ssize_t cap = p->cap ? p->cap * 2 : 64;
    pair_t *items = PyMem_Realloc(p->items, (size_t)cap * sizeof(pair_t));
    if (!items) { PyErr_NoMemory(); return -1; }
    p->items = items;
    p->cap = cap;
    return 0;
}

static int insert(pairs_t *p, uint64_t a, uint64_t b) {
    if (reserve(p) < 0) return -1;
    Py_ssize_t i = lower_bound(p, a, b);
    memmove(&p->items[i + 1], &p->items[i], (size_t)(p->n - i) * sizeof(pair_t));
    p->items[i].a = a;
    p->items[i].b = b;
    p->n++;
    return 0;
}

static void remove_at(pairs_t *p, Py_ssize_t i) {
    memmove(&p->items[i], &p->items[i + 1], (size_t)(p->n - i - 1) * sizeof(pair_t));
    p->n--;
}

static int remove_pair(pairs_t *p, uint64_t a, uint64_t b) {
    Py_ssize_t i = lower_bound(p, a, b);
    if (i == p->n || p->items[i].a != a || p->items[i].b != b) return -1;
    remove_at(p, i);
    return 0;
}

static Py_ssize_t block_index(const BestFit *self, uint64_t ptr) {
    Py_ssize_t lo = 0, hi = self->nblocks;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (self->blocks[mid] < ptr) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static int is_block_start(const BestFit *self, uint64_t ptr) {
    Py_ssize_t i = block_index(self, ptr);
    return i < self->nblocks && self->blocks[i] == ptr;
}

/* Both arrays at once; on failure neither changed. */
static int add_range(BestFit *self, uint64_t addr, uint64_t size) {
    if (reserve(&self->by_size) < 0 || reserve(&self->by_addr) < 0) return -1;
    insert(&self->by_size, size, addr);
    insert(&self->by_addr, addr, size);
    self->free_bytes += size;
    return 0;
}

static void drop_range(BestFit *self, uint64_t addr, uint64_t size) {
    remove_pair(&self->by_size, size, addr);
    remove_pair(&self->by_addr, addr, size);
    self->free_bytes -= size;
}

static int parse_u64(PyObject *args, uint64_t *x, uint64_t *y) {
    unsigned long long a, b;
    if (!PyArg_ParseTuple(args, "KK", &a, &b)) return -1;
    *x = a;
    *y = b;
    return 0;
}

/* Cut `need` bytes from the front of the smallest free range that holds them.
   1: *addr is set; 0: no range holds them; -1: out of memory (a Python error is set, nothing changed). */
static int bf_take(BestFit *self, uint64_t need, uint64_t *addr) {
    pairs_t *by_size = &self->by_size;
    Py_ssize_t i = lower_bound(by_size, need, 0);
    if (i == by_size->n) return 0;
    uint64_t size = by_size->items[i].a;
    *addr = by_size->items[i].b;
    Py_ssize_t k = lower_bound(&self->by_addr, *addr, size);
    self->free_bytes -= need;
    if (size == need) {
        remove_at(by_size, i);
        remove_at(&self->by_addr, k);
        return 1;
    }
    /* The tail stays free. Ranges never overlap, so it keeps its place among the addresses; among the
       sizes it moves down to where (size - need, address + need) sorts, shifting the ranges between. */
    uint64_t rest = size - need, at = *addr + need;
    self->by_addr.items[k].a = at;
    self->by_addr.items[k].b = rest;
    Py_ssize_t lo = 0, hi = i;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        const pair_t *m = &by_size->items[mid];
        if (m->a < rest || (m->a == rest && m->b < at)) lo = mid + 1; else hi = mid;
    }
    memmove(&by_size->items[lo + 1], &by_size->items[lo], (size_t)(i - lo) * sizeof(pair_t));
    by_size->items[lo].a = rest;
    by_size->items[lo].b = at;
    return 1;
}

/* Free a range and merge it with its neighbours within one block. 0, or -1 with nothing changed. */
static int bf_give(BestFit *self, uint64_t ptr, uint64_t size) {
    uint64_t start = ptr, end = ptr + size;
    if (reserve(&self->by_size) < 0 || reserve(&self->by_addr) < 0) return -1;
    Py_ssize_t j = lower_bound(&self->by_addr, ptr, 0);
    /* Neighbours merge only within one block: a range that starts a block has no neighbour below,
       and a free range that starts a block is no neighbour above. */
    if (j < self->by_addr.n && self->by_addr.items[j].a == end && !is_block_start(self, end)) {
        uint64_t above = self->by_addr.items[j].b;
        drop_range(self, end, above);
        end += above;
    }
    if (j > 0 && !is_block_start(self, ptr)) {
        pair_t below = self->by_addr.items[j - 1];
        if (below.a + below.b == ptr) {
            drop_range(self, below.a, below.b);
            start = below.a;
        }
    }
    add_range(self, start, end - start);    /* room was reserved above */
    return 0;
}

static PyObject *BestFit_take(BestFit *self, PyObject *arg) {
    unsigned long long need = PyLong_AsUnsignedLongLong(arg);
    if (need == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    uint64_t addr;
    int found = bf_take(self, need, &addr);
    if (found < 0) return NULL;
    if (!found) Py_RETURN_NONE;          /* nothing holds it: the pool grows */
    return PyLong_FromUnsignedLongLong(addr);
}

static PyObject *BestFit_give(BestFit *self, PyObject *args) {
    uint64_t ptr, size;
    if (parse_u64(args, &ptr, &size) < 0 || bf_give(self, ptr, size) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *BestFit_add_block(BestFit *self, PyObject *args) {
    uint64_t ptr, size;
    if (parse_u64(args, &ptr, &size) < 0) return NULL;
    if (self->nblocks == self->cblocks) {
        Py_ssize_t cap = self->cblocks ? self->cblocks * 2 : 16;
        uint64_t *blocks = PyMem_Realloc(self->blocks, (size_t)cap * sizeof(uint64_t));
        if (!blocks) return PyErr_NoMemory();
        self->blocks = blocks;
        self->cblocks = cap;
    }
    if (add_range(self, ptr, size) < 0) return NULL;
    Py_ssize_t i = block_index(self, ptr);
    memmove(&self->blocks[i + 1], &self->blocks[i], (size_t)(self->nblocks - i) * sizeof(uint64_t));
    self->blocks[i] = ptr;
    self->nblocks++;
    Py_RETURN_NONE;
}

static PyObject *BestFit_clear(BestFit *self, PyObject *unused) {
    self->by_size.n = self->by_addr.n = 0;
    self->nblocks = 0;
    self->free_bytes = 0;
    Py_RETURN_NONE;
}

static PyObject *BestFit_ranges(BestFit *self, PyObject *unused) {
    PyObject *out = PyList_New(self->by_addr.n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < self->by_addr.n; i++) {
        PyObject *item = Py_BuildValue("(KK)", (unsigned long long)self->by_addr.items[i].a,
                                       (unsigned long long)self->by_addr.items[i].b);
        if (!item) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyObject *BestFit_largest(BestFit *self, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(self->by_size.n ? self->by_size.items[self->by_size.n - 1].a : 0);
}

static PyObject *BestFit_free_bytes(BestFit *self, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(self->free_bytes);
}

static void BestFit_dealloc(BestFit *self) {
    PyMem_Free(self->by_size.items);
    PyMem_Free(self->by_addr.items);
    PyMem_Free(self->blocks);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef BestFit_methods[] = {
    {"take", (PyCFunction)BestFit_take, METH_O, "take(need) -> address, or None when no free range holds it"},
    {"give", (PyCFunction)BestFit_give, METH_VARARGS, "give(ptr, size): free a range, merging with neighbours"},
    {"add_block", (PyCFunction)BestFit_add_block, METH_VARARGS, "add_block(ptr, size): a new block, all free"},
    {"clear", (PyCFunction)BestFit_clear, METH_NOARGS, "forget every block and range"},
    {"ranges", (PyCFunction)BestFit_ranges, METH_NOARGS, "[(address, size)] of every free range, by address"},
    {"largest", (PyCFunction)BestFit_largest, METH_NOARGS, "the largest free range's size (0 when none)"},
    {"free_bytes", (PyCFunction)BestFit_free_bytes, METH_NOARGS, "the bytes of every free range"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BestFitType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "uvm_lab.mr._pool.BestFit",
    .tp_doc = "The pool's best-fit, coalescing free list (compiled).",
    .tp_basicsize = sizeof(BestFit),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)BestFit_dealloc,
    .tp_methods = BestFit_methods,
};

/* An exact int's value as 64 unsigned bits: 1, or 0 (no error set) when it is negative or too large.
   PyLong_AsUnsignedLongLong goes through a byte array for every multi-digit int; this does not. */
static int as_u64(PyObject *o, uint64_t *value) {
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (!overflow) {
        *value = (uint64_t)v;
        return v >= 0;
    }
    if (overflow < 0) return 0;
    *value = PyLong_AsUnsignedLongLong(o);
    if (*value == (uint64_t)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    return 1;
}

/* ---- RLock: the pool's re-entrant lock, which the hot path takes without a Python call -----------
 *
 * threading.RLock's rules (the owner may take it again; only the owner may release it), used from
 * Python as `with pool._lock:` and from C by lock_take/lock_give. A waiter waits without the GIL.
 */

typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    unsigned long owner;
    unsigned long count;
} RLock;

static int lock_take(RLock *self, PY_TIMEOUT_T timeout_us) {
    unsigned long me = PyThread_get_thread_ident();
    if (self->count && self->owner == me) {
        self->count++;
        return 1;
    }
    PyLockStatus got = PyThread_acquire_lock_timed(self->lock, 0, 0);
    if (got != PY_LOCK_ACQUIRED && timeout_us != 0) {
        Py_BEGIN_ALLOW_THREADS
        got = PyThread_acquire_lock_timed(self->lock, timeout_us, 0);
        Py_END_ALLOW_THREADS
    }
    if (got != PY_LOCK_ACQUIRED) return 0;
    self->owner = me;
    self->count = 1;
    return 1;
}

static int lock_give(RLock *self) {
    if (!self->count || self->owner != PyThread_get_thread_ident()) {
        PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
        return -1;
    }
    if (--self->count == 0) {
        self->owner = 0;
        PyThread_release_lock(self->lock);
    }
    return 0;
}

static PyObject *RLock_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    RLock *self = (RLock *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->lock = PyThread_allocate_lock();
    if (!self->lock) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_MemoryError, "cannot allocate a lock");
        return NULL;
    }
    return (PyObject *)self;
}

static void RLock_dealloc(RLock *self) {
    if (self->lock) {
        if (self->count) PyThread_release_lock(self->lock);
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *RLock_acquire(RLock *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|pd:acquire", names, &blocking, &timeout)) return NULL;
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    if (timeout * 1e6 >= (double)PY_TIMEOUT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
        return NULL;
    }
    PY_TIMEOUT_T us = !blocking ? 0 : timeout == -1 ? -1 : (PY_TIMEOUT_T)(timeout * 1e6);
    return PyBool_FromLong(lock_take(self, us));
}

static PyObject *RLock_enter(RLock *self, PyObject *unused) {
    (void)unused;
    lock_take(self, -1);
    Py_RETURN_TRUE;
}

static PyObject *RLock_release(RLock *self, PyObject *unused) {
    (void)unused;
    if (lock_give(self) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *RLock_exit(RLock *self, PyObject *args) {
    (void)args;
    if (lock_give(self) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *RLock_is_owned(RLock *self, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(self->count && self->owner == PyThread_get_thread_ident());
}

static PyMethodDef RLock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))RLock_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool"},
    {"release", (PyCFunction)RLock_release, METH_NOARGS, "release()"},
    {"__enter__", (PyCFunction)RLock_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)RLock_exit, METH_VARARGS, NULL},
    {"_is_owned", (PyCFunction)RLock_is_owned, METH_NOARGS, "whether the calling thread holds the lock"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RLockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "uvm_lab.mr._pool.RLock",
    .tp_doc = "A re-entrant lock with threading.RLock's rules, which compiled code takes without a Python call.",
    .tp_basicsize = sizeof(RLock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = RLock_new,
    .tp_dealloc = (destructor)RLock_dealloc,
    .tp_methods = RLock_methods,
};

/* ---- LiveTable: the pool's allocations, address -> (nbytes, alloc_id) -------------------------------
 *
 * What MemoryResource keeps in a dict, kept in an open-addressing hash table of plain integers, so that
 * recording and dropping an allocation makes no Python object. To Python it is the part of a dict the
 * resource classes use: get, [], [] =, del, in, len, values, items, keys. Addresses are non-zero;
 * linear probing, deletion by shifting back (no tombstones), at most half full.
 */

typedef struct {
    uint64_t key, size, id;        /* key 0: empty */
} slot_t;

typedef struct {
    PyObject_HEAD
    slot_t *slots;
    Py_ssize_t cap, n;             /* cap a power of two */
} LiveTable;

static inline Py_ssize_t live_home(const LiveTable *t, uint64_t key) {
    return (Py_ssize_t)(((key >> 8) * 0x9E3779B97F4A7C15ull) >> 17) & (t->cap - 1);
}

static slot_t *live_find(const LiveTable *t, uint64_t key) {
    if (!key || !t->cap) return NULL;
    for (Py_ssize_t i = live_home(t, key);; i = (i + 1) & (t->cap - 1)) {
        slot_t *s = &t->slots[i];
        if (s->key == key) return s;
        if (!s->key) return NULL;
    }
}

static int live_grow(LiveTable *t) {
    Py_ssize_t cap = t->cap ? t->cap * 2 : 64;
    slot_t *slots = PyMem_Calloc((size_t)cap, sizeof(slot_t));
    if (!slots) { PyErr_NoMemory(); return -1; }
    slot_t *old = t->slots;
    Py_ssize_t old_cap = t->cap;
    t->slots = slots;
    t->cap = cap;
    for (Py_ssize_t i = 0; i < old_cap; i++) {
        if (!old[i].key) continue;
        Py_ssize_t j = live_home(t, old[i].key);
        while (slots[j].key) j = (j + 1) & (cap - 1);
        slots[j] = old[i];
    }
    PyMem_Free(old);
    return 0;
}

/* Set key -> (size, id), adding or replacing. 0, or -1 (out of memory) with nothing changed. */
static int live_set(LiveTable *t, uint64_t key, uint64_t size, uint64_t id) {
    slot_t *s = live_find(t, key);
    if (s) { s->size = size; s->id = id; return 0; }
    if (2 * (t->n + 1) > t->cap && live_grow(t) < 0) return -1;
    Py_ssize_t i = live_home(t, key);
    while (t->slots[i].key) i = (i + 1) & (t->cap - 1);
    t->slots[i].key = key;
    t->slots[i].size = size;
    t->slots[i].id = id;
    t->n++;
    return 0;
}

static void live_remove(LiveTable *t, slot_t *s) {
    Py_ssize_t mask = t->cap - 1, i = s - t->slots, j = i;
    for (;;) {                       /* shift back every entry whose probe passed through the hole */
        j = (j + 1) & mask;
        if (!t->slots[j].key) break;
        Py_ssize_t home = live_home(t, t->slots[j].key);
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            t->slots[i] = t->slots[j];
            i = j;
        }
    }
    t->slots[i].key = 0;
    t->n--;
}

/* A Python key as an address: 1, or 0 (no error set) for what can never be a key here. */
static int live_key(PyObject *o, uint64_t *key) {
    if (PyLong_CheckExact(o)) return as_u64(o, key) && *key;
    PyObject *index = PyNumber_Index(o);
    if (!index) { PyErr_Clear(); return 0; }
    int ok = as_u64(index, key) && *key;
    Py_DECREF(index);
    return ok;
}

static PyObject *held_tuple(const slot_t *s) {
    return Py_BuildValue("(KK)", (unsigned long long)s->size, (unsigned long long)s->id);
}

static PyObject *LiveTable_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    (void)args; (void)kwds;
    return type->tp_alloc(type, 0);
}

static void LiveTable_dealloc(LiveTable *self) {
    PyMem_Free(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t LiveTable_len(LiveTable *self) { return self->n; }

static PyObject *LiveTable_subscript(LiveTable *self, PyObject *key) {
    uint64_t k;
    slot_t *s = live_key(key, &k) ? live_find(self, k) : NULL;
    if (!s) { PyErr_SetObject(PyExc_KeyError, key); return NULL; }
    return held_tuple(s);
}

static int LiveTable_ass_subscript(LiveTable *self, PyObject *key, PyObject *value) {
    uint64_t k;
    if (!live_key(key, &k)) {
        if (value) PyErr_Format(PyExc_TypeError, "a live table's keys are non-zero addresses, got %R", key);
        else PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    if (!value) {
        slot_t *s = live_find(self, k);
        if (!s) { PyErr_SetObject(PyExc_KeyError, key); return -1; }
        live_remove(self, s);
        return 0;
    }
    unsigned long long size, id;
    if (!PyTuple_Check(value) || !PyArg_ParseTuple(value, "KK", &size, &id)) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "a live table holds (nbytes, alloc_id) tuples of ints, got %R", value);
        }
        return -1;
    }
    return live_set(self, k, size, id);
}

static int LiveTable_contains(LiveTable *self, PyObject *key) {
    uint64_t k;
    return live_key(key, &k) && live_find(self, k) != NULL;
}

static PyObject *LiveTable_get(LiveTable *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(address, default=None)");
        return NULL;
    }
    uint64_t k;
    slot_t *s = live_key(args[0], &k) ? live_find(self, k) : NULL;
    if (s) return held_tuple(s);
    PyObject *fallback = nargs == 2 ? args[1] : Py_None;
    Py_INCREF(fallback);
    return fallback;
}

static int by_key(const void *a, const void *b) {
    uint64_t x = ((const slot_t *)a)->key, y = ((const slot_t *)b)->key;
    return (x > y) - (x < y);
}

/* 0: keys, 1: values, 2: items; a list, by address */
static PyObject *live_list(LiveTable *self, int what) {
    slot_t *sorted = PyMem_Malloc((size_t)(self->n ? self->n : 1) * sizeof(slot_t));
    if (!sorted) return PyErr_NoMemory();
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < self->cap; i++)
        if (self->slots[i].key) sorted[n++] = self->slots[i];
    qsort(sorted, (size_t)n, sizeof(slot_t), by_key);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        const slot_t *s = &sorted[i];
        PyObject *item = what == 0 ? PyLong_FromUnsignedLongLong(s->key)
                       : what == 1 ? held_tuple(s)
                       : Py_BuildValue("(K(KK))", (unsigned long long)s->key, (unsigned long long)s->size,
                                       (unsigned long long)s->id);
        if (!item) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, item);
    }
    PyMem_Free(sorted);
    return out;
}

static PyObject *LiveTable_keys(LiveTable *self, PyObject *unused) { (void)unused; return live_list(self, 0); }
static PyObject *LiveTable_values(LiveTable *self, PyObject *unused) { (void)unused; return live_list(self, 1); }
static PyObject *LiveTable_items(LiveTable *self, PyObject *unused) { (void)unused; return live_list(self, 2); }

static PyObject *LiveTable_iter(LiveTable *self) {
    PyObject *keys = live_list(self, 0);
    if (!keys) return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static PyMappingMethods LiveTable_mapping = {
    .mp_length = (lenfunc)LiveTable_len,
    .mp_subscript = (binaryfunc)LiveTable_subscript,
    .mp_ass_subscript = (objobjargproc)LiveTable_ass_subscript,
};

static PySequenceMethods LiveTable_sequence = {
    .sq_contains = (objobjproc)LiveTable_contains,
};

static PyMethodDef LiveTable_methods[] = {
    {"get", (PyCFunction)(void (*)(void))LiveTable_get, METH_FASTCALL, "get(address, default=None) -> (nbytes, alloc_id)"},
    {"keys", (PyCFunction)LiveTable_keys, METH_NOARGS, "the live addresses, in order"},
    {"values", (PyCFunction)LiveTable_values, METH_NOARGS, "(nbytes, alloc_id) of every live allocation, by address"},
    {"items", (PyCFunction)LiveTable_items, METH_NOARGS, "(address, (nbytes, alloc_id)), by address"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LiveTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "uvm_lab.mr._pool.LiveTable",
    .tp_doc = "The pool's live allocations, address -> (nbytes, alloc_id), as plain integers (compiled).",
    .tp_basicsize = sizeof(LiveTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = LiveTable_new,
    .tp_dealloc = (destructor)LiveTable_dealloc,
    .tp_as_mapping = &LiveTable_mapping,
    .tp_as_sequence = &LiveTable_sequence,
    .tp_iter = (getiterfunc)LiveTable_iter,
    .tp_methods = LiveTable_methods,
};

/* ---- HotPath: PoolMemoryResource.allocate/deallocate for the common call ------------------------
 *
 * allocate(nbytes, stream=None) and deallocate(ptr, nbytes, stream=None) with plain positive ints and
 * None or an int stream run here, with exactly the Python path's effects: the resource's lock held
 * around the free list and its table of live allocations (ptr -> (nbytes, alloc_id)), the next
 * allocation id, and one ALLOC or FREE record queued on the event bus. Every other call (sizes as
 * strings, stream objects, keywords, a request the free list cannot hold, anything that will raise)
 * goes to the Python method, `slow_allocate` / `slow_deallocate`, which does all of it in full.
 *
 * The hot path keeps only a weak reference to its pool, so a pool that is dropped is freed at once (a
 * strong one would be a cycle, pool -> its allocate -> pool, left to the cyclic collector). A bound
 * `pool.allocate` kept after the pool is gone raises `gone` (InvalidStateError) instead of handing
 * out memory the pool has given back.
 */

#define ALIGNMENT 256

typedef struct {
    PyObject_HEAD
    PyObject *pool;                 /* weakref to the PoolMemoryResource */
    BestFit *free;
    LiveTable *live;
    PyObject *ids;                  /* iterator of allocation ids */
    RLock *lock;                    /* the resource's lock */
    PyObject *now;                  /* () -> int ns */
    PyObject *queue;                /* the bus's bytearray of packed allocator records */
    int64_t device, kind_alloc, kind_free;
    int monotonic;                  /* `now` is time.perf_counter_ns: read CLOCK_MONOTONIC, as it does, directly */
    PyObject *slow_allocate, *slow_deallocate;   /* unbound Python methods */
    PyObject *gone;                 /* the error raised once the pool is gone */
} HotPath;

static int HotPath_traverse(HotPath *self, visitproc visit, void *arg) {
    Py_VISIT(self->pool); Py_VISIT(self->free); Py_VISIT(self->live); Py_VISIT(self->ids);
    Py_VISIT(self->lock); Py_VISIT(self->now); Py_VISIT(self->queue);
    Py_VISIT(self->slow_allocate); Py_VISIT(self->slow_deallocate); Py_VISIT(self->gone);
    return 0;
}

static int HotPath_clear(HotPath *self) {
    Py_CLEAR(self->pool); Py_CLEAR(self->free); Py_CLEAR(self->live); Py_CLEAR(self->ids);
    Py_CLEAR(self->lock); Py_CLEAR(self->now); Py_CLEAR(self->queue);
    Py_CLEAR(self->slow_allocate); Py_CLEAR(self->slow_deallocate); Py_CLEAR(self->gone);
    return 0;
}

static void HotPath_dealloc(HotPath *self) {
    PyObject_GC_UnTrack(self);
    HotPath_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int HotPath_init(HotPath *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"pool", "free", "live", "ids", "lock", "now", "queue", "device", "kind_alloc",
                            "kind_free", "slow_allocate", "slow_deallocate", "gone", NULL};
    PyObject *pool, *free, *live, *ids, *lock, *now, *queue, *sa, *sd, *gone;
    long long device, ka, kf;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!O!OO!OO!LLLOOO", names, &pool, &BestFitType, &free,
                                     &LiveTableType, &live, &ids, &RLockType, &lock, &now, &PyByteArray_Type, &queue,
                                     &device, &ka, &kf, &sa, &sd, &gone))
        return -1;
    if (!PyIter_Check(ids) || !PyCallable_Check(now) || !PyCallable_Check(sa) || !PyCallable_Check(sd)) {
        PyErr_SetString(PyExc_TypeError, "HotPath: ids must be an iterator; now and the slow paths callables");
        return -1;
    }
    PyObject *ref = PyWeakref_NewRef(pool, NULL);
    if (!ref) return -1;
    HotPath_clear(self);
    self->pool = ref;
    Py_INCREF(lock); self->lock = (RLock *)lock;
    Py_INCREF(free); self->free = (BestFit *)free;
    Py_INCREF(live); self->live = (LiveTable *)live;
    Py_INCREF(ids); self->ids = ids;
    Py_INCREF(now); self->now = now;
    Py_INCREF(queue); self->queue = queue;
    self->device = device;
    self->kind_alloc = ka;
    self->kind_free = kf;
    Py_INCREF(sa); self->slow_allocate = sa;
    Py_INCREF(sd); self->slow_deallocate = sd;
    Py_INCREF(gone); self->gone = gone;
    self->monotonic = 0;
#if defined(CLOCK_MONOTONIC) && defined(__linux__)
    PyObject *time = PyImport_ImportModule("time");
    PyObject *perf = time ? PyObject_GetAttrString(time, "perf_counter_ns") : NULL;
    Py_XDECREF(time);
    if (!perf) return -1;
    self->monotonic = PyObject_RichCompareBool(now, perf, Py_EQ) == 1;   /* (a builtin compares by identity) */
    Py_DECREF(perf);
#endif
    return 0;
}

/* The pool, a new reference; or NULL with `gone` raised once it has been collected. */
static PyObject *pool_of(HotPath *self) {
    PyObject *pool;
#if PY_VERSION_HEX >= 0x030D0000
    if (PyWeakref_GetRef(self->pool, &pool) < 0) return NULL;
#else
    pool = PyWeakref_GetObject(self->pool);
    pool = pool == Py_None ? NULL : Py_NewRef(pool);
#endif
    if (!pool)
        PyErr_SetString(self->gone, "this PoolMemoryResource has been garbage-collected and its memory given back; "
                                    "keep a reference to the pool for as long as its allocate/deallocate are used");
    return pool;
}

static int pool_gone(HotPath *self) {
    PyObject *pool = pool_of(self);
    Py_XDECREF(pool);
    return pool == NULL;
}

/* The full Python method, called with the pool and the caller's own arguments. */
static PyObject *slow(HotPath *self, PyObject *method, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *pool = pool_of(self);
    if (!pool) return NULL;
    PyObject *bound = PyMethod_New(method, pool);
    Py_DECREF(pool);
    if (!bound) return NULL;
    PyObject *out = PyObject_Vectorcall(bound, args, nargsf, kwnames);
    Py_DECREF(bound);
    return out;
}

/* A positive exact int that fits in 64 bits, or 0 (no error set) for anything else. */
static uint64_t plain_size(PyObject *o) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || v <= 0) { PyErr_Clear(); return 0; }
    return (uint64_t)v;
}

/* None (0) or a non-negative exact int that fits in 64 bits: the stream's handle. 0 for the slow path. */
static int plain_stream(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t at, uint64_t *handle) {
    if (nargs <= at || args[at] == Py_None) { *handle = 0; return 1; }
    return PyLong_CheckExact(args[at]) && as_u64(args[at], handle);
}

/* uvm_lab.events._sources' capture(): the calling user line's source id (sources_api_t there). */
typedef struct {
    int64_t (*capture)(void);
} sources_api_t;
static sources_api_t *sources_api = NULL;

/* Queue one record on the bus: (kind, device, now, ptr, nbytes, alloc_id, stream, source) as eight little-endian
   64-bit ints, uvm_lab.events.bus.ALLOCATOR_RECORD, appended to the bus's bytearray. */
static int emit(HotPath *self, int64_t kind, uint64_t ptr, uint64_t nbytes, int64_t alloc_id, uint64_t stream) {
    int64_t t;
#ifdef CLOCK_MONOTONIC
    struct timespec ts;
    if (self->monotonic && clock_gettime(CLOCK_MONOTONIC, &ts) == 0) {
        t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    } else
#endif
    {
        PyObject *now = PyObject_CallNoArgs(self->now);
        if (!now) return -1;
        int overflow;     /* (PyLong_AsLongLong goes through a byte array for large ints) */
        t = PyLong_AsLongLongAndOverflow(now, &overflow);
        Py_DECREF(now);
        if (PyErr_Occurred()) return -1;
        if (overflow) {
            PyErr_SetString(PyExc_OverflowError, "the clock's time does not fit in 64 bits");
            return -1;
        }
    }
    int64_t source = sources_api->capture();
    if (source < 0) {   /* the line is lost, never the allocation: the pool's state has already changed */
        PyErr_WriteUnraisable(NULL);
        source = 0;
    }
    uint64_t record[8] = {(uint64_t)kind, (uint64_t)self->device, (uint64_t)t, ptr, nbytes, (uint64_t)alloc_id, stream,
                          (uint64_t)source};
#if PY_BIG_ENDIAN
    for (int i = 0; i < 8; i++) record[i] = __builtin_bswap64(record[i]);
#endif
    Py_ssize_t n = PyByteArray_GET_SIZE(self->queue);
    if (PyByteArray_Resize(self->queue, n + (Py_ssize_t)sizeof record) < 0) return -1;
    memcpy(PyByteArray_AS_STRING(self->queue) + n, record, sizeof record);
    return 0;
}

static PyObject *HotPath_allocate(HotPath *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    uint64_t size = (kwnames == NULL && (nargs == 1 || nargs == 2)) ? plain_size(args[0]) : 0, stream;
    if (!size || !plain_stream(args, nargs, 1, &stream))
        return slow(self, self->slow_allocate, args, nargsf, kwnames);
    uint64_t need = (size + ALIGNMENT - 1) & ~(uint64_t)(ALIGNMENT - 1), addr;
    if (pool_gone(self)) return NULL;

    lock_take(self->lock, -1);
    int found = bf_take(self->free, need, &addr);
    if (found <= 0) {
        if (lock_give(self->lock) < 0 || found < 0) return NULL;
        return slow(self, self->slow_allocate, args, nargsf, kwnames);   /* the pool grows, or fails, there */
    }
    /* The id is taken only once the memory is, as the Python path does: ids run without gaps. */
    int64_t id = 0;
    int overflow = 0;
    PyObject *id_obj = PyIter_Next(self->ids);
    if (id_obj) {
        id = PyLong_AsLongLongAndOverflow(id_obj, &overflow);
        Py_DECREF(id_obj);
    }
    PyObject *ptr = id > 0 && !overflow ? PyLong_FromUnsignedLongLong(addr) : NULL;
    if (!ptr || live_set(self->live, addr, size, (uint64_t)id) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "the allocation ids have run out");
        bf_give(self->free, addr, need);      /* nothing is lost: the range goes back (its room is still there) */
        Py_XDECREF(ptr);
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        lock_give(self->lock);
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    if (lock_give(self->lock) < 0 || emit(self, self->kind_alloc, addr, size, id, stream) < 0) {
        Py_DECREF(ptr);
        return NULL;
    }
    return ptr;
}

static PyObject *HotPath_deallocate(HotPath *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    uint64_t addr = 0, stream;
    int plain = kwnames == NULL && (nargs == 2 || nargs == 3) && PyLong_CheckExact(args[0]) && as_u64(args[0], &addr);
    uint64_t size = plain ? plain_size(args[1]) : 0;
    if (!size || !plain_stream(args, nargs, 2, &stream))
        return slow(self, self->slow_deallocate, args, nargsf, kwnames);
    if (pool_gone(self)) return NULL;

    lock_take(self->lock, -1);
    slot_t *held = live_find(self->live, addr);
    if (!held || held->size != size) {
        if (lock_give(self->lock) < 0) return NULL;
        return slow(self, self->slow_deallocate, args, nargsf, kwnames);   /* it names what is wrong */
    }
    int64_t id = (int64_t)held->id;
    if (bf_give(self->free, addr, (size + ALIGNMENT - 1) & ~(uint64_t)(ALIGNMENT - 1)) < 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        lock_give(self->lock);
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    live_remove(self->live, held);
    if (lock_give(self->lock) < 0 || emit(self, self->kind_free, addr, size, id, stream) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef HotPath_methods[] = {
    {"allocate", (PyCFunction)(void (*)(void))HotPath_allocate, METH_FASTCALL | METH_KEYWORDS,
     "allocate($self, nbytes, stream=None)\n--\n\n"
     "Allocate nbytes (an int, or a string such as \"2GiB\") and return the address "
     "(PoolMemoryResource.allocate, compiled)."},
    {"deallocate", (PyCFunction)(void (*)(void))HotPath_deallocate, METH_FASTCALL | METH_KEYWORDS,
     "deallocate($self, ptr, nbytes, stream=None)\n--\n\n"
     "Give back ptr, which this pool returned for nbytes bytes (PoolMemoryResource.deallocate, compiled)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HotPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "uvm_lab.mr._pool.HotPath",
    .tp_doc = "PoolMemoryResource.allocate/deallocate for plain int sizes and streams (compiled).",
    .tp_basicsize = sizeof(HotPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)HotPath_init,
    .tp_dealloc = (destructor)HotPath_dealloc,
    .tp_traverse = (traverseproc)HotPath_traverse,
    .tp_clear = (inquiry)HotPath_clear,
    .tp_methods = HotPath_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pool", "The pool's free list and hot path, compiled.", -1, NULL,
};

PyMODINIT_FUNC PyInit__pool(void) {
    /* Without the compiled capture the pool's events would lose their lines: then the Python pool runs. */
    sources_api = (sources_api_t *)PyCapsule_Import("uvm_lab.events._sources._C_API", 0);
    if (!sources_api) return NULL;
    if (PyType_Ready(&BestFitType) < 0 || PyType_Ready(&RLockType) < 0 || PyType_Ready(&LiveTableType) < 0 ||
        PyType_Ready(&HotPathType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&BestFitType);
    Py_INCREF(&HotPathType);
    Py_INCREF(&RLockType);
    Py_INCREF(&LiveTableType);
    if (PyModule_AddObject(m, "BestFit", (PyObject *)&BestFitType) < 0 ||
        PyModule_AddObject(m, "RLock", (PyObject *)&RLockType) < 0 ||
        PyModule_AddObject(m, "LiveTable", (PyObject *)&LiveTableType) < 0 ||
        PyModule_AddObject(m, "HotPath", (PyObject *)&HotPathType) < 0 ||
        PyModule_AddIntConstant(m, "RECORD_SIZE", 8 * sizeof(uint64_t)) < 0) {   /* what emit() writes */
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
