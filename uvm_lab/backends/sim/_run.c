/* A GPU stream's run of plain fault batches, compiled: FaultEngine._run_chunk's loop, for as long as each batch is
 * one that service_plain takes.
 *
 * The loop scans for the first access that cannot proceed (as _usable, in windows that double while everything
 * hits), charges the hits before it, forms the batch (the first fault_batch_size distinct faulting pages among the
 * next in_flight accesses, as _batch_pages), services it with _service.c's plain batch and charges the batch's
 * accesses: the same records, clock (the same float operations in the same order), state and counters as the
 * Python loop, batch by batch. A random gather and a strided read are such runs from end to end, and the Python
 * loop cost more a batch than the batch itself.
 *
 * It stops, before changing anything for it, at a batch that is not plain (or a page outside the table): the
 * Python loop then goes on from there, as it would have.
 */
#include "_simcore.h"

enum {  /* hit[]: the costs of accesses that proceed, and the remote time kept apart (read and written) */
    H_LOCAL, H_REMOTE, H_READ_S, H_WRITTEN_S, NHIT
};
enum {  /* tally[]: what StreamStats, the log and the thrashing notes gain */
    T_BATCHES, T_FAULTS, T_EVICTIONS, T_HTOD, T_PREFETCHED, T_REMOTE_BYTES, T_RECORDS, T_NOTED, NTALLY
};

/* FaultEngine._hits for a GPU with FIFO eviction: local accesses at memory bandwidth, remote reads over the link
 * now, remote writes apart (weighed at the stream's end). */
static inline void hits(double *clock, double *hit, int64_t *tally, int64_t n_local, int64_t n_remote,
                        int64_t n_written, int64_t bytes_per_access) {
    clock[0] += ((double)n_local * hit[H_LOCAL] + (double)(n_remote - n_written) * hit[H_REMOTE]) * 1e9;
    if (n_remote) {
        hit[H_READ_S] += (double)(n_remote - n_written) * hit[H_REMOTE];
        hit[H_WRITTEN_S] += (double)n_written * hit[H_REMOTE];
    }
    tally[T_REMOTE_BYTES] += n_remote * bytes_per_access;
}

/* A page set for one batch (see sim_seen_add), kept from call to call. */
static uint64_t *seen;
static size_t seen_cap;

PyDoc_STRVAR(run_plain_doc,
"run_plain(<service_plain's 26 arguments, with pages the stream's and wr one flag for all>, writable, pos,\n"
"          in_flight, batch_size, scan, scan_max, hit, bytes_per_access, tally)\n--\n\n"
"FaultEngine._run_chunk's loop from pos on, for a GPU with FIFO eviction, while each batch is a plain one\n"
"(see _run.c). writable: the page table's; scan: the loop's window, doubling up to scan_max while every access\n"
"proceeds; hit (float64 [4]): the cost of a local and of a remote access, and the remote seconds read and\n"
"written so far (added to); tally (int64 [8]): batches, faults, evictions, bytes copied, bytes prefetched, bytes\n"
"accessed remotely, records written into tail and thrashing notes added (added to). Returns (pos, scan,\n"
"records): where the Python loop goes on, its window, and None or, where a batch's records did not fit tail,\n"
"those as EVENT_DTYPE bytes (the loop stops after that batch).");

static PyObject *run_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    enum { A_WRITABLE = PLAIN_ARGS, A_POS, A_IN_FLIGHT, A_BATCH, A_SCAN, A_SCAN_MAX, A_HIT, A_BPA, A_TALLY, NARGS };
    if (sim_arity("run_plain", nargs, NARGS) < 0) return NULL;
    if (!PyBool_Check(args[PLAIN_WR_ARG])) {
        PyErr_SetString(PyExc_TypeError, "run_plain(): wr must be True or False");
        return NULL;
    }
    int write = args[PLAIN_WR_ARG] == Py_True;
    Py_ssize_t pos = PyLong_AsSsize_t(args[A_POS]), in_flight = PyLong_AsSsize_t(args[A_IN_FLIGHT]);
    Py_ssize_t batch_size = PyLong_AsSsize_t(args[A_BATCH]), scan = PyLong_AsSsize_t(args[A_SCAN]);
    Py_ssize_t scan_max = PyLong_AsSsize_t(args[A_SCAN_MAX]);
    long long bytes_per_access = PyLong_AsLongLong(args[A_BPA]);
    if (PyErr_Occurred()) return NULL;
    enum { R_PAGES, R_WRITABLE, R_HIT, R_TALLY, NRUN };
    static const sim_arg_t spec[NRUN] = {
        {PLAIN_PAGES_ARG, 8, 0, 0, "pages"}, {A_WRITABLE, 1, 0, 0, "writable"}, {A_HIT, 8, 1, 0, "hit"},
        {A_TALLY, 8, 1, 0, "tally"},
    };
    Py_buffer v[NPLAIN], rv[NRUN];
    int held[NPLAIN], rheld[NRUN];
    plain_t c;
    if (sim_plain_open(args, v, held, &c) < 0) return NULL;
    if (sim_buffers(args, spec, NRUN, rv, rheld) < 0) { sim_release(v, held, NPLAIN); return NULL; }
    PyObject *result = NULL, *pending = NULL;
    const int64_t *pages = rv[R_PAGES].buf;
    Py_ssize_t n = rv[R_PAGES].len / 8;
    if (rv[R_WRITABLE].len != c.table || rv[R_HIT].len != NHIT * 8 || rv[R_TALLY].len != NTALLY * 8) {
        PyErr_SetString(PyExc_ValueError, "run_plain(): arrays of inconsistent lengths");
        goto done;
    }
    if (pos < 0 || pos > n || in_flight < 1 || batch_size < 1 || batch_size > (1 << 20) || scan < 1 ||
        scan_max < scan || bytes_per_access < 0) {
        PyErr_Format(PyExc_ValueError, "run_plain(): pos must lie in the stream (0-%zd), in_flight, batch_size (at "
                     "most 2**20) and scan be positive, scan_max at least scan, bytes_per_access not negative", n);
        goto done;
    }
    if (!seen || seen_cap < (size_t)batch_size * 4) {
        size_t cap = 64;
        while (cap < (size_t)batch_size * 4) cap <<= 1;
        uint64_t *grown = PyMem_Realloc(seen, cap * sizeof(uint64_t));
        if (!grown) { PyErr_NoMemory(); goto done; }
        seen = grown;
        seen_cap = cap;
    }
    int64_t *uniq = PyMem_Malloc((size_t)batch_size * 8);
    uint8_t *wpages = PyMem_Malloc((size_t)batch_size);
    if (!uniq || !wpages) { PyMem_Free(uniq); PyMem_Free(wpages); PyErr_NoMemory(); goto done; }
    memset(wpages, write, (size_t)batch_size);
    const uint8_t *writable = rv[R_WRITABLE].buf;
    double *hit = rv[R_HIT].buf;
    int64_t *tally = rv[R_TALLY].buf;
    uint8_t g = (uint8_t)(1 << (c.processor + 1));
    Py_ssize_t first_scan = in_flight > 1024 ? in_flight : 1024, filled0 = c.filled;
    while (pos < n) {
        /* The accesses that proceed, up to the first that cannot (or a page outside the table, which the Python
         * loop then meets and raises on, with what came before it done). */
        Py_ssize_t end = n - pos < scan ? n : pos + scan, i = pos;
        int64_t n_remote = 0;
        for (; i < end; i++) {
            if (pages[i] < 0 || pages[i] >= c.table) break;   /* the Python loop raises there */
            int how = sim_proceeds(c.state, c.read_mostly, writable, c.accessed_by, c.remote, pages[i], write, g, 1);
            if (!how) break;
            n_remote += how == 2;
        }
        if (i > pos) hits(c.clock, hit, tally, i - pos - n_remote, n_remote, write ? n_remote : 0, bytes_per_access);
        if (i == end) {
            pos = end;
            scan = 2 * scan < scan_max ? 2 * scan : scan_max;
            continue;
        }
        pos = i;
        scan = first_scan;
        /* The batch: the first batch_size distinct faulting pages among the next in_flight accesses, and the access
         * where the next batch begins (cut). */
        Py_ssize_t window = n - pos < in_flight ? n - pos : in_flight, cut = window, k = 0;
        int64_t batch_remote = 0;
        memset(seen, 0, seen_cap * sizeof(uint64_t));
        for (Py_ssize_t j = 0; j < window; j++) {
            int64_t p = pages[pos + j];
            if (p < 0 || p >= c.table) { k = -1; break; }
            int how = sim_proceeds(c.state, c.read_mostly, writable, c.accessed_by, c.remote, p, write, g, 1);
            if (how) { batch_remote += how == 2; continue; }
            if (!sim_seen_add(seen, seen_cap, p)) continue;
            if (k == batch_size) { cut = j; break; }
            uniq[k++] = p;
        }
        if (k < 0) break;   /* a page outside the table: the Python loop raises there */
        sim_sort_pages(uniq, k, (int64_t *)seen);   /* through the set's memory, done with */
        plain_done_t d;
        int taken = sim_plain_batch(&c, uniq, k, wpages, &d);
        if (taken < 0) goto free_done;
        if (!taken) break;
        tally[T_BATCHES]++;
        tally[T_FAULTS] += k;
        tally[T_EVICTIONS] += d.evictions;
        tally[T_HTOD] += d.copied;
        tally[T_PREFETCHED] += d.prefetched;
        tally[T_NOTED] += d.noted;
        if (d.direct) {
            c.filled += d.nrec;
        } else if (!(pending = PyBytes_FromStringAndSize((const char *)d.records,
                                                           d.nrec * (Py_ssize_t)sizeof(record_t)))) {
            goto free_done;
        }
        hits(c.clock, hit, tally, cut - batch_remote, batch_remote, write ? batch_remote : 0, bytes_per_access);
        pos += cut;
        if (pending) break;   /* the Python loop puts them in a new tail */
    }
    tally[T_RECORDS] += c.filled - filled0;
    result = Py_BuildValue("(nnO)", pos, scan, pending ? pending : Py_None);
free_done:
    PyMem_Free(uniq);
    PyMem_Free(wpages);
done:
    Py_XDECREF(pending);
    sim_release(rv, rheld, NRUN);
    sim_release(v, held, NPLAIN);
    return result;
}

PyMethodDef sim_run_plain_method = {"run_plain", (PyCFunction)(void (*)(void))run_plain, METH_FASTCALL,
                                    run_plain_doc};
