/* Which accesses proceed without a fault, compiled: FaultEngine._usable in one pass over the stream.
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
        int64_t p = pages[i];
        uint8_t st = state[p];
        int here = (st & g) != 0;
        if (here && (all_write || (wr && wr[i]))) {
            /* A write to a read-only mapping faults: a duplicate's, or a ReadMostly page's that its holder has
             * not written since the advice or the last duplication. */
            if (st != g || (rm[p] && !(writable[p] & g))) here = 0;
        }
        int reachable = reach == 1 ? (st & 1) != 0 : reach == 2 ? st > 1 : 0;
        local[i] = (uint8_t)here;
        out[i] = (uint8_t)(!here && ((acc[p] | rem[p]) & g) && reachable && !(st & g));
    }
    result = Py_NewRef(Py_None);
done:
    sim_release(v, held, NBUF);
    return result;
}

PyMethodDef sim_usable_method = {"usable", (PyCFunction)(void (*)(void))usable, METH_FASTCALL, usable_doc};
