/* The pool's free list, compiled: the same best-fit, coalescing rules as uvm_lab.mr.bestfit.PyBestFit.
 *
 * Free ranges are kept twice, in two sorted arrays of (key, value) pairs: by (size, address) for the
 * best-fit search, and by (address, size) to find a freed range's neighbours. Block starts are a
 * third sorted array: ranges never merge across them. Searches are binary; inserts and removals move
 * the tail of an array, which for the tens to thousands of free ranges of a pool is cheaper than any tree.
 * The caller (PoolMemoryResource) holds its lock around every call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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

static PyObject *BestFit_take(BestFit *self, PyObject *arg) {
    unsigned long long need = PyLong_AsUnsignedLongLong(arg);
    if (need == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_ssize_t i = lower_bound(&self->by_size, need, 0);
    if (i == self->by_size.n) Py_RETURN_NONE;          /* nothing holds it: the pool grows */
    uint64_t size = self->by_size.items[i].a, addr = self->by_size.items[i].b;
    remove_at(&self->by_size, i);
    remove_pair(&self->by_addr, addr, size);
    self->free_bytes -= size;
    if (size > need && add_range(self, addr + need, size - need) < 0) return NULL;   /* the tail stays free */
    return PyLong_FromUnsignedLongLong(addr);
}

static PyObject *BestFit_give(BestFit *self, PyObject *args) {
    uint64_t ptr, size;
    if (parse_u64(args, &ptr, &size) < 0) return NULL;
    uint64_t start = ptr, end = ptr + size;
    if (reserve(&self->by_size) < 0 || reserve(&self->by_addr) < 0) return NULL;
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
    .tp_name = "uvm_lab.mr._bestfit.BestFit",
    .tp_doc = "The pool's best-fit, coalescing free list (compiled).",
    .tp_basicsize = sizeof(BestFit),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)BestFit_dealloc,
    .tp_methods = BestFit_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_bestfit", "The pool's free list, compiled.", -1, NULL,
};

PyMODINIT_FUNC PyInit__bestfit(void) {
    if (PyType_Ready(&BestFitType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&BestFitType);
    if (PyModule_AddObject(m, "BestFit", (PyObject *)&BestFitType) < 0) {
        Py_DECREF(&BestFitType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
