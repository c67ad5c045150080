/* Which accesses proceed without a fault, and which faults make a batch, compiled: FaultEngine._usable in one
 * pass over the stream, and the batch's distinct pages (FaultEngine._run_chunk) in one pass over its faults.
 *
 * An access proceeds on a local copy (one its processor may write, for a write) or through a mapping of a
 * copy it can reach. The numpy code in FaultEngine._usable gives the same two masks; the tests hold this to it.
 */
#include "_simcore.h"

PyDoc_STRVAR(usable_doc,
"usable(state, read_mostly, writable, accessed_by, remote, pages, writes, g, reach, local, remote_out)\n--\n\n"
"For each of pages (int64): local[i] = it proceeds on a local copy, remote_out[i] = through a remote mapping\n"
"(uint8 outputs, as long as pages). writes: False, True or a bool array as long as pages; g: the processor's\n"
"residency bit; reach: which holders a mapping can reach: 1 the host's copy (a GPU faulting), 2 a GPU's (a\n"
"host that can map GPU memory), 0 none. state, read_mostly, writable, accessed_by, remote: the page table's.");

static PyObject *usable(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (sim_arity("usable", nargs, 11) < 0) return NULL;
    long g = PyLong_AsLong(args[7]), reach = PyLong_AsLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    if (g <= 0 || g > 128 || (g & (g - 1)) || reach < 0 || reach > 2) {
        PyErr_Format(PyExc_ValueError, "usable(): g must be one residency bit and reach 0, 1 or 2, got %ld, %ld",
                     g, reach);
        return NULL;
    }
    PyObject *writes = args[6];
    int all_write = writes == Py_True, per_page = !PyBool_Check(writes);
    enum { STATE, RM, WRITABLE, ACC, REMOTE, PAGES_, WRITES, LOCAL, OUT, NBUF };
    static const sim_arg_t spec[NBUF] = {
        {0, 1, 0, 0, "state"}, {1, 1, 0, 0, "read_mostly"}, {2, 1, 0, 0, "writable"}, {3, 1, 0, 0, "accessed_by"},
        {4, 1, 0, 0, "remote"}, {5, 8, 0, 0, "pages"}, {6, 1, 0, 1, "writes"}, {9, 1, 1, 0, "local"},
        {10, 1, 1, 0, "remote_out"},
    };
    Py_buffer v[NBUF];
    int held[NBUF];
    PyObject *result = NULL;
    if (sim_buffers(args, spec, NBUF, v, held) < 0) return NULL;
    Py_ssize_t table = v[STATE].len, n = v[PAGES_].len / 8;
    if (v[RM].len != table || v[WRITABLE].len != table || v[ACC].len != table || v[REMOTE].len != table ||
        (per_page && v[WRITES].len != n) || v[LOCAL].len != n || v[OUT].len != n) {
        PyErr_SetString(PyExc_ValueError, "usable(): arrays of inconsistent lengths");
        goto done;
    }
    const uint8_t *state = v[STATE].buf, *rm = v[RM].buf, *writable = v[WRITABLE].buf, *acc = v[ACC].buf;
    const uint8_t *rem = v[REMOTE].buf, *wr = per_page ? v[WRITES].buf : NULL;
    const int64_t *pages = v[PAGES_].buf;
    uint8_t *local = v[LOCAL].buf, *out = v[OUT].buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (pages[i] < 0 || pages[i] >= table) {
            PyErr_SetString(PyExc_IndexError, "usable(): a page lies outside the page table");
            goto done;
        }
    for (Py_ssize_t i = 0; i < n; i++) {
        int how = sim_proceeds(state, rm, writable, acc, rem, pages[i], all_write || (wr && wr[i]), (uint8_t)g,
                               (int)reach);
        local[i] = how == 1;
        out[i] = how == 2;
    }
    result = Py_NewRef(Py_None);
done:
    sim_release(v, held, NBUF);
    return result;
}

PyMethodDef sim_usable_method = {"usable", (PyCFunction)(void (*)(void))usable, METH_FASTCALL, usable_doc};

void sim_sort_pages(int64_t *pages, Py_ssize_t n, int64_t *scratch) {
    /* A bottom-up merge sort; a sweep's batch is in order already. */
    int sorted = 1;
    for (Py_ssize_t i = 1; i < n && sorted; i++) sorted = pages[i - 1] < pages[i];
    int64_t *a = pages, *b = scratch;
    for (Py_ssize_t width = 1; !sorted && width < n; width *= 2) {
        for (Py_ssize_t lo = 0; lo < n; lo += 2 * width) {
            Py_ssize_t mid = lo + width < n ? lo + width : n;
            Py_ssize_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            Py_ssize_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) b[k++] = a[i] <= a[j] ? a[i++] : a[j++];
            while (i < mid) b[k++] = a[i++];
            while (j < hi) b[k++] = a[j++];
        }
        int64_t *swap = a; a = b; b = swap;
    }
    if (a != pages) memcpy(pages, a, (size_t)n * 8);
}

PyDoc_STRVAR(batch_pages_doc,
"batch_pages(faults, limit, out)\n--\n\n"
"The fault batch among faults (int64 pages, in stream order): the first limit distinct pages, by first\n"
"occurrence. Writes them to out (int64, room for limit), sorted, and returns (count, stop): stop is the index\n"
"in faults of the first occurrence of the page past the first limit (the first access of the next batch), or\n"
"-1 where faults hold limit distinct pages or fewer.");

static PyObject *batch_pages(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (sim_arity("batch_pages", nargs, 3) < 0) return NULL;
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    if (limit < 1 || limit > (1 << 20)) {
        PyErr_Format(PyExc_ValueError, "batch_pages(): limit must be 1 to 2**20, got %zd", limit);
        return NULL;
    }
    enum { FAULTS, OUT, NBUF };
    static const sim_arg_t spec[NBUF] = {{0, 8, 0, 0, "faults"}, {2, 8, 1, 0, "out"}};
    Py_buffer v[NBUF];
    int held[NBUF];
    PyObject *result = NULL;
    uint64_t *seen = NULL;
    if (sim_buffers(args, spec, NBUF, v, held) < 0) return NULL;
    if (v[OUT].len < limit * 8) {
        PyErr_SetString(PyExc_ValueError, "batch_pages(): out holds fewer than limit pages");
        goto done;
    }
    const int64_t *faults = v[FAULTS].buf;
    int64_t *out = v[OUT].buf;
    Py_ssize_t n = v[FAULTS].len / 8, count = 0, stop = -1;
    /* An open-addressing set of the pages met, a quarter full at most; page + 1 so that 0 is a free slot. */
    size_t cap = 64;
    while (cap < (size_t)limit * 4) cap <<= 1;
    seen = calloc(cap, sizeof(uint64_t));
    if (!seen) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!sim_seen_add(seen, cap, faults[i])) continue;
        if (count == limit) { stop = i; break; }   /* the first page past the batch begins the next */
        out[count++] = faults[i];
    }
    sim_sort_pages(out, count, (int64_t *)seen);   /* through the set's memory */
    result = Py_BuildValue("(nn)", count, stop);
done:
    free(seen);
    sim_release(v, held, NBUF);
    return result;
}

PyMethodDef sim_batch_pages_method = {"batch_pages", (PyCFunction)(void (*)(void))batch_pages, METH_FASTCALL,
                                      batch_pages_doc};
