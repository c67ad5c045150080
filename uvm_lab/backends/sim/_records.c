/* A run's records, compiled: one record per run of pages, as the simulator writes copies and faults.
 *
 * run_records is page_runs(pages, distinct=True) followed by EventLog.add_many in C: the same records (as
 * EVENT_DTYPE rows), stamped on the clock with the same float operations in the same order (the build turns
 * off contraction into fused multiply-adds). The numpy code stays as the fallback and as the reference the
 * tests hold this to.
 */
#include "_simcore.h"

Py_ssize_t sim_run_records(const int64_t *pages, Py_ssize_t n, uint8_t kind, uint8_t flags, int16_t src,
                           int16_t dst, uint64_t stream, const uint64_t *address, const uint64_t *alloc,
                           const double *seconds, int value, const int64_t *faulted, Py_ssize_t nfaulted, double *clock,
                           record_t *out) {
    Py_ssize_t runs = 0, f = 0;
    for (Py_ssize_t i = 0; i < n;) {   /* the runs first: how many decides how the clock runs */
        Py_ssize_t j = i + 1;
        while (j < n && pages[j] == pages[j - 1] + 1 && (pages[j] & (PAGES - 1))) j++;
        int64_t first = pages[i], len = j - i, b = block_of(first);
        record_t *r = &out[runs++];
        r->kind = kind;
        r->flags = flags;
        r->src = src;
        r->dst = dst;
        r->address = address[b] + (uint64_t)((first & (PAGES - 1)) * PAGE_SIZE);
        r->bytes = (uint64_t)len * PAGE_SIZE;
        r->alloc_id = alloc[b];
        r->stream = stream;
        r->source = 0;
        if (value == VALUE_BYTES) {
            r->value = r->bytes;
        } else if (value == VALUE_PAGES) {
            r->value = (uint64_t)len;
        } else {
            uint64_t c = 0;
            while (f < nfaulted && faulted[f] < first) f++;
            while (f < nfaulted && faulted[f] < first + len) { c++; f++; }
            r->value = c;
        }
        r->start = (uint64_t)len;   /* the run's length, until the clock below replaces it */
        i = j;
    }
    /* EventLog.add_many: up to four records one after another; more, from the clock by a running sum. */
    double t = *clock, acc = 0.0, t0 = t;
    for (Py_ssize_t k = 0; k < runs; k++) {
        double d = seconds ? seconds[out[k].start] * 1e9 : 0.0;
        double start = t;
        if (runs <= 4) {
            t = start + d;
        } else {
            acc += d;
            t = t0 + acc;
        }
        out[k].start = (uint64_t)start;
        out[k].end = (uint64_t)t;
    }
    *clock = t;
    return runs;
}

PyDoc_STRVAR(run_records_doc,
"run_records(pages, kind, flags, src, dst, stream, block_address, block_alloc, seconds, value, faulted, t, out)\n"
"--\n\n"
"One record per run of consecutive pages (cut at 2 MiB blocks) of pages (int64, sorted, distinct), written to\n"
"out (EVENT_DTYPE, room for len(pages)); returns (records, clock). Each record lasts seconds[run length]\n"
"(float64, 513 of them: link_seconds of each run's bytes) or nothing where seconds is None, back to back\n"
"from the clock t as EventLog.add_many stamps them. value: 0 the run's bytes, 1 its pages, 2 how many of its\n"
"pages are in faulted (int64, sorted). block_address and block_alloc are the page table's (uint64).");

static PyObject *run_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (sim_arity("run_records", nargs, 13) < 0) return NULL;
    long kind = PyLong_AsLong(args[1]), flags = PyLong_AsLong(args[2]), src = PyLong_AsLong(args[3]);
    long dst = PyLong_AsLong(args[4]), value = PyLong_AsLong(args[9]);
    unsigned long long stream = PyLong_AsUnsignedLongLong(args[5]);
    double t = PyFloat_AsDouble(args[11]);
    if (PyErr_Occurred()) return NULL;
    if (kind < 0 || kind > 255 || flags < 0 || flags > 255 || src < -32768 || src > 32767 || dst < -32768 ||
        dst > 32767 || value < VALUE_BYTES || value > VALUE_FAULTED || (value == VALUE_FAULTED && args[10] == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "run_records(): kind, flags, src, dst or value out of range");
        return NULL;
    }
    enum { PAGES_, ADDR, ALLOC, SECONDS, FAULTED, OUT, NBUF };
    static const sim_arg_t spec[NBUF] = {
        {0, 8, 0, 0, "pages"}, {6, 8, 0, 0, "block_address"}, {7, 8, 0, 0, "block_alloc"}, {8, 8, 0, 1, "seconds"},
        {10, 8, 0, 1, "faulted"}, {12, (Py_ssize_t)sizeof(record_t), 1, 0, "out"},
    };
    Py_buffer v[NBUF];
    int held[NBUF];
    PyObject *result = NULL;
    if (sim_buffers(args, spec, NBUF, v, held) < 0) return NULL;
    const int64_t *pages = v[PAGES_].buf;
    const uint64_t *address = v[ADDR].buf, *alloc = v[ALLOC].buf;
    const double *seconds = held[SECONDS] ? v[SECONDS].buf : NULL;
    const int64_t *faulted = held[FAULTED] ? v[FAULTED].buf : NULL;
    Py_ssize_t n = v[PAGES_].len / 8, nblocks = v[ADDR].len / 8, nfaulted = held[FAULTED] ? v[FAULTED].len / 8 : 0;
    if (v[ALLOC].len != v[ADDR].len || v[OUT].len < n * (Py_ssize_t)sizeof(record_t) ||
        (seconds && v[SECONDS].len < (PAGES + 1) * 8)) {
        PyErr_SetString(PyExc_ValueError, "run_records(): arrays of inconsistent lengths");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pages[i] < 0 || block_of(pages[i]) >= nblocks || (i && pages[i] <= pages[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "run_records(): pages must be sorted, distinct and in the page table");
            goto done;
        }
    }
    Py_ssize_t runs = sim_run_records(pages, n, (uint8_t)kind, (uint8_t)flags, (int16_t)src, (int16_t)dst,
                                      (uint64_t)stream, address, alloc, seconds, (int)value, faulted, nfaulted, &t,
                                      (record_t *)v[OUT].buf);
    result = Py_BuildValue("nd", runs, t);
done:
    sim_release(v, held, NBUF);
    return result;
}

PyMethodDef sim_run_records_method = {"run_records", (PyCFunction)(void (*)(void))run_records, METH_FASTCALL,
                                      run_records_doc};
