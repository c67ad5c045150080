/* The simulator's compiled core: what its C files share.
 *
 * One extension module (_simcore) built from _access.c (which accesses proceed), _prefetch.c (the density
 * prefetcher), _eviction.c (a run of evictions), _records.c (records of copies and faults), _service.c (a
 * plain fault batch, whole) and _run.c (a stream's run of plain batches and the hits between them), with
 * _simcore.c registering their functions. Each function has a numpy or Python twin that gives the same pages,
 * records and clock, to the bit (_service.c's and _run.c's: FaultEngine._service and _run_chunk, for plain
 * batches); the tests hold each to its twin.
 */
#ifndef UVM_LAB_SIMCORE_H
#define UVM_LAB_SIMCORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define PAGES 512            /* 4 KiB pages of a 2 MiB block */
#define BLOCK_SHIFT 9
#define PAGE_SIZE 4096
#define NO_LOCATION (-2)     /* model.NO_LOCATION: no advice */

/* uvm_lab.events.schema.EVENT_DTYPE, packed. */
typedef struct __attribute__((packed)) {
    uint8_t kind, flags;
    int16_t src, dst;
    uint64_t start, end, address, bytes, value, alloc_id, stream;
    uint32_t source;   /* stamped by the backend when it publishes: the records of one call share it */
} record_t;

/* The 2 MiB block of a page (pages are never negative). A shift: gcc divides by PAGES with idiv in loops it
 * takes for cold, and that loop was half of a strided batch's time. */
static inline int64_t block_of(int64_t page) { return page >> BLOCK_SHIFT; }

_Static_assert(sizeof(record_t) == 66, "EVENT_DTYPE is 66 bytes");

/* How access of page p by the processor with residency bit g proceeds: 1 on a local copy (one it may write, for a
 * write), 2 through a mapping of a copy it can reach (reach: 1 the host's copy, 2 a GPU's, 0 none), 0 it faults.
 * A write to a read-only mapping faults: a duplicate's, or a ReadMostly page's that its holder has not written
 * since the advice or the last duplication. */
static inline int sim_proceeds(const uint8_t *state, const uint8_t *read_mostly, const uint8_t *writable,
                               const uint8_t *accessed_by, const uint8_t *remote, int64_t p, int write, uint8_t g,
                               int reach) {
    uint8_t st = state[p];
    if ((st & g) && !(write && (st != g || (read_mostly[p] && !(writable[p] & g))))) return 1;
    int reachable = reach == 1 ? (st & 1) != 0 : reach == 2 ? st > 1 : 0;
    return ((accessed_by[p] | remote[p]) & g) && reachable && !(st & g) ? 2 : 0;
}

/* Add page to an open-addressing set of pages (held as page + 1, 0 a free slot; cap a power of two, kept a
 * quarter full at most); 1 where it was not there. */
static inline int sim_seen_add(uint64_t *seen, size_t cap, int64_t page) {
    uint64_t key = (uint64_t)page + 1;
    size_t h = (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 32) & (cap - 1);
    while (seen[h] && seen[h] != key) h = (h + 1) & (cap - 1);
    if (seen[h]) return 0;
    seen[h] = key;
    return 1;
}

/* The page table's per-page arrays, from a block's first page on. */
typedef struct {
    const uint8_t *state;
    const int8_t *preferred;
    const uint8_t *remote, *accessed_by;
} block_t;

/* 0 where a function given nargs arguments takes that many, else -1 with a TypeError naming it. */
static inline int sim_arity(const char *function, Py_ssize_t nargs, Py_ssize_t takes) {
    if (nargs == takes) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", function, takes, nargs);
    return -1;
}

/* An array argument of a function: its position, its items' size, whether it is written, and whether it may be
 * given as no array at all (None, or True or False for a flag that is either one value or one per item). */
typedef struct {
    int arg;
    Py_ssize_t itemsize;
    int writable, optional;
    const char *name;
} sim_arg_t;

/* Release the buffers taken (held[i] set) among the first n. */
static inline void sim_release(Py_buffer *views, const int *held, int n) {
    for (int i = 0; i < n; i++)
        if (held[i]) PyBuffer_Release(&views[i]);
}

/* Each spec's argument as a C-contiguous buffer (an optional one given as no array: held[i] = 0). On failure,
 * with an exception set, what was taken is released and -1 returned. */
static inline int sim_buffers(PyObject *const *args, const sim_arg_t *spec, int n, Py_buffer *views, int *held) {
    for (int i = 0; i < n; i++) {
        held[i] = 0;
        PyObject *obj = args[spec[i].arg];
        if (spec[i].optional && (obj == Py_None || PyBool_Check(obj))) continue;
        if (PyObject_GetBuffer(obj, &views[i], PyBUF_C_CONTIGUOUS | (spec[i].writable ? PyBUF_WRITABLE : 0)) < 0) {
            sim_release(views, held, i);
            return -1;
        }
        held[i] = 1;
        if (views[i].itemsize != spec[i].itemsize) {
            PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes expected, got %zd", spec[i].name, spec[i].itemsize,
                         views[i].itemsize);
            sim_release(views, held, i + 1);
            return -1;
        }
    }
    return 0;
}

/* _prefetch.c: the pages the prefetcher adds to one block's faults (see region's doc); returns how many. */
Py_ssize_t sim_block_region(block_t blk, uint8_t g, int8_t processor, const int64_t *lanes, Py_ssize_t k,
                            int64_t n, int64_t threshold, const uint8_t *thrash, int64_t first_page, int64_t *out,
                            uint8_t *empty);

/* _eviction.c: the runs of pages only g holds in each victim, moved to the host (see victim_runs' doc);
 * returns how many, or -1 (nothing changed) where a victim holds a duplicate. Victims must lie in the table. */
Py_ssize_t sim_victim_runs(uint8_t *state, const int64_t *victims, const int64_t *npages, Py_ssize_t n, uint8_t g,
                           int64_t *starts, int64_t *lengths, int64_t *owner);
/* _eviction.c: the clock of a run of evictions (see clock_by_victim's doc); returns the clock after them. */
double sim_eviction_clock(const int64_t *per_victim, Py_ssize_t victims, const double *durations, double now,
                          double wait, double *begin, double *finish);

/* _records.c: one record per run of sorted, distinct pages (see run_records' doc); returns how many, and
 * advances *t. value: VALUE_BYTES, VALUE_PAGES or VALUE_FAULTED (with faulted, sorted). */
enum { VALUE_BYTES, VALUE_PAGES, VALUE_FAULTED };
Py_ssize_t sim_run_records(const int64_t *pages, Py_ssize_t n, uint8_t kind, uint8_t flags, int16_t src,
                           int16_t dst, uint64_t stream, const uint64_t *address, const uint64_t *alloc,
                           const double *seconds, int value, const int64_t *faulted, Py_ssize_t nfaulted, double *t,
                           record_t *out);

/* _access.c: sort n pages in place, with room for n more in scratch. */
void sim_sort_pages(int64_t *pages, Py_ssize_t n, int64_t *scratch);

/* _service.c: a plain GPU batch (see service_plain's doc), shared with _run.c's loop of them. service_plain's
 * arguments but pages and wr (see its doc) are opened by sim_plain_open into these buffers and a plain_t. */
enum {
    P_STATE, P_READ_MOSTLY, P_PREFERRED, P_ACCESSED_BY, P_REMOTE, P_CHUNK, P_BLOCK_PAGES, P_ADDRESS, P_ALLOC,
    P_LAST_USE, P_COSTS, P_HTOD_S, P_EVICT_S, P_CODES, P_COUNTERS, P_CLOCK, P_NOTE_P, P_NOTE_T, P_TAIL, NPLAIN
};
enum { PLAIN_ARGS = 26, PLAIN_PAGES_ARG = 10, PLAIN_WR_ARG = 11 };
typedef struct {
    uint8_t *state, *remote, *chunk;
    const uint8_t *read_mostly, *accessed_by;
    const int8_t *preferred;
    const int16_t *block_pages;
    const uint64_t *address, *alloc;
    int64_t *last_use, *counters;
    const int64_t *codes;
    const double *costs, *htod_s, *evict_s;
    double *clock;
    int8_t *note_p;          /* NULL: the thrashing detector is off */
    int64_t *note_t;
    record_t *tail;          /* NULL: no tail given */
    Py_ssize_t tail_len, filled, table, nblocks;
    long processor, threshold;
    long long lapse;
    PyObject *order;         /* GpuMemory's FIFO, an OrderedDict */
} plain_t;

/* What a batch taken by sim_plain_batch made. */
typedef struct {
    record_t *records;       /* the tail from filled on (direct), else work space */
    Py_ssize_t nrec, evictions, noted;
    int direct;
    int64_t copied, prefetched;
} plain_done_t;

/* 0 with every buffer held, or -1 with an exception set and none held. */
int sim_plain_open(PyObject *const *args, Py_buffer *v, int *held, plain_t *c);
/* 1: the batch (pages sorted, distinct and in the table; wr one flag a page) was serviced; 0: it is not a plain
 * batch, and nothing changed; -1: an exception is set. */
int sim_plain_batch(const plain_t *c, const int64_t *pages, Py_ssize_t n, const uint8_t *wr, plain_done_t *done);

/* The functions each file gives Python. */
extern PyMethodDef sim_region_method, sim_victim_runs_method, sim_clock_method, sim_run_records_method,
    sim_service_method, sim_usable_method, sim_batch_pages_method,
    sim_run_plain_method;

#endif
