/* Eviction, compiled: the pages a run of victims copies back to the host, and when each copy starts and ends.
 *
 * victim_runs is the page scan of GpuMemory._evict_many (and the state change of GpuMemory.evicted);
 * clock_by_victim is GpuMemory._clock_by_victim, with the same float operations in the same order (the
 * build turns off contraction into fused multiply-adds), so the records and the clock are the same to the
 * bit. The numpy and Python code stays as the fallback and as the reference the tests hold this to.
 */
#include "_simcore.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

double sim_eviction_clock(const int64_t *per, Py_ssize_t victims, const double *d, double now, double wait,
                          double *begin, double *finish) {
    Py_ssize_t r = 0;
    for (Py_ssize_t v = 0; v < victims; v++) {
        int64_t c = per[v];
        if (c <= 4) {
            for (int64_t i = r; i < r + c; i++) {
                begin[i] = now;
                now = now + d[i];
                finish[i] = now;
            }
        } else {
            double acc = 0.0, t0 = now;
            for (int64_t i = r; i < r + c; i++) {
                begin[i] = now;
                acc += d[i];
                now = t0 + acc;
                finish[i] = now;
            }
        }
        r += c;
        now = now + wait;
    }
    return now;
}

/* Bit p of only: page p is held by g alone; of held: by g and maybe others. Pages from n on are clear. */
static void page_masks(const uint8_t *st, uint8_t g, int64_t n, uint64_t only[PAGES / 64], uint64_t held[PAGES / 64]) {
    memset(only, 0, PAGES / 8);
    memset(held, 0, PAGES / 8);
#if defined(__SSE2__)
    const __m128i gv = _mm_set1_epi8((char)g);
    for (int w = 0; w < PAGES / 16; w++) {
        __m128i x = _mm_loadu_si128((const __m128i *)(st + 16 * w));
        uint64_t o = (uint64_t)_mm_movemask_epi8(_mm_cmpeq_epi8(x, gv));
        uint64_t h = (uint64_t)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_and_si128(x, gv), gv));
        only[w >> 2] |= o << ((w & 3) * 16);
        held[w >> 2] |= h << ((w & 3) * 16);
    }
#else
    for (int p = 0; p < PAGES; p++) {
        only[p >> 6] |= (uint64_t)(st[p] == g) << (p & 63);
        held[p >> 6] |= (uint64_t)((st[p] & g) != 0) << (p & 63);
    }
#endif
    for (int w = 0; w < PAGES / 64; w++) {   /* pages that exist only */
        int64_t lo = (int64_t)w * 64;
        uint64_t valid = n >= lo + 64 ? ~0ULL : n <= lo ? 0 : (1ULL << (n - lo)) - 1;
        only[w] &= valid;
        held[w] &= valid;
    }
}

/* The first page from p on whose bit in mask is want (1 or 0), or PAGES. */
static int64_t next_bit(const uint64_t mask[PAGES / 64], int64_t p, int want) {
    int w = (int)(p >> 6);
    if (w >= PAGES / 64) return PAGES;
    uint64_t m = (want ? mask[w] : ~mask[w]) & (~0ULL << (p & 63));
    while (!m) {
        if (++w >= PAGES / 64) return PAGES;
        m = want ? mask[w] : ~mask[w];
    }
    return (int64_t)w * 64 + __builtin_ctzll(m);
}

Py_ssize_t sim_victim_runs(uint8_t *state, const int64_t *victims, const int64_t *npages, Py_ssize_t n, uint8_t g,
                           int64_t *starts, int64_t *lengths, int64_t *owner) {
    uint64_t only[PAGES / 64], held[PAGES / 64];
    for (Py_ssize_t i = 0; i < n; i++) {   /* check everything before changing anything */
        page_masks(state + victims[i] * PAGES, g, npages[i], only, held);
        for (int w = 0; w < PAGES / 64; w++)
            if (held[w] & ~only[w]) return -1;
    }
    Py_ssize_t runs = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t *st = state + victims[i] * PAGES;
        int64_t first = victims[i] * PAGES;
        page_masks(st, g, npages[i], only, held);
        for (int64_t p = next_bit(only, 0, 1); p < PAGES; p = next_bit(only, p, 1)) {
            int64_t q = next_bit(only, p, 0);   /* the pages from npages on are clear: the run stops there */
            memset(st + p, 1, (size_t)(q - p));
            starts[runs] = first + p;
            lengths[runs] = q - p;
            owner[runs] = i;
            runs++;
            p = q;
        }
    }
    return runs;
}

PyDoc_STRVAR(clock_doc,
"clock_by_victim(per_victim, durations, now, wait, begin, finish)\n--\n\n"
"Start and end (ns) of each eviction copy, victim after victim, and the clock after them (returned).\n"
"per_victim: copies of each victim (int64); durations: each copy's ns (float64, sum(per_victim) of them);\n"
"now: the clock; wait: the ns a victim's chunk takes to be given up after its copies; begin, finish: float64\n"
"outputs, as long as durations. A victim of up to four copies advances the clock copy by copy, a larger one\n"
"from its start by the running sum of its copies (as EventLog.add_many does).");

static PyObject *clock_by_victim(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (sim_arity("clock_by_victim", nargs, 6) < 0) return NULL;
    double now = PyFloat_AsDouble(args[2]), wait = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) return NULL;
    enum { PER, DUR, BEGIN, FINISH, NBUF };
    static const sim_arg_t spec[NBUF] = {
        {0, 8, 0, 0, "per_victim"}, {1, 8, 0, 0, "durations"}, {4, 8, 1, 0, "begin"}, {5, 8, 1, 0, "finish"},
    };
    Py_buffer v[NBUF];
    int held[NBUF];
    PyObject *result = NULL;
    if (sim_buffers(args, spec, NBUF, v, held) < 0) return NULL;
    const int64_t *per = v[PER].buf;
    const double *d = v[DUR].buf;
    double *begin = v[BEGIN].buf, *finish = v[FINISH].buf;
    Py_ssize_t victims = v[PER].len / 8, n = v[DUR].len / 8, r = 0;
    if (v[BEGIN].len < v[DUR].len || v[FINISH].len < v[DUR].len) {
        PyErr_SetString(PyExc_ValueError, "clock_by_victim(): begin and finish must be as long as durations");
        goto done;
    }
    for (Py_ssize_t i = 0; i < victims; i++) {
        if (per[i] < 0 || per[i] > n - r) break;
        r += per[i];
    }
    if (r != n) {
        PyErr_SetString(PyExc_ValueError, "clock_by_victim(): per_victim does not add up to the durations");
        goto done;
    }
    now = sim_eviction_clock(per, victims, d, now, wait, begin, finish);
    result = PyFloat_FromDouble(now);
done:
    sim_release(v, held, NBUF);
    return result;
}

PyDoc_STRVAR(runs_doc,
"victim_runs(state, victims, npages, g, starts, lengths, owner)\n--\n\n"
"The copies that evicting victims (blocks, in eviction order) makes: each run of consecutive pages that only\n"
"this GPU (residency bit g) holds, victim by victim, as its first page, its length and its victim's index,\n"
"written to starts, lengths, owner (int64, room for 256 a victim); returns how many runs, and sets those\n"
"pages' state to the host's (1). Returns -1 and changes nothing where a victim holds a page that another\n"
"processor holds too (a duplicate: those are invalidated between the copies, victim by victim).\n"
"state: the page table's uint8 states; victims: int64; npages: pages per victim (int64).");

static PyObject *victim_runs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (sim_arity("victim_runs", nargs, 7) < 0) return NULL;
    long g = PyLong_AsLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (g <= 1 || g > 128 || (g & (g - 1))) {
        PyErr_Format(PyExc_ValueError, "victim_runs(): g must be one GPU's residency bit, got %ld", g);
        return NULL;
    }
    enum { STATE, VICTIMS, NPAGES, STARTS, LENGTHS, OWNER, NBUF };
    static const sim_arg_t spec[NBUF] = {
        {0, 1, 1, 0, "state"}, {1, 8, 0, 0, "victims"}, {2, 8, 0, 0, "npages"}, {4, 8, 1, 0, "starts"},
        {5, 8, 1, 0, "lengths"}, {6, 8, 1, 0, "owner"},
    };
    Py_buffer v[NBUF];
    int held[NBUF];
    PyObject *result = NULL;
    if (sim_buffers(args, spec, NBUF, v, held) < 0) return NULL;
    uint8_t *state = v[STATE].buf;
    const int64_t *victims = v[VICTIMS].buf, *npages = v[NPAGES].buf;
    int64_t *starts = v[STARTS].buf, *lengths = v[LENGTHS].buf, *owner = v[OWNER].buf;
    Py_ssize_t n = v[VICTIMS].len / 8, table = v[STATE].len;
    if (v[NPAGES].len != v[VICTIMS].len || v[STARTS].len < n * 256 * 8 || v[LENGTHS].len < n * 256 * 8 ||
        v[OWNER].len < n * 256 * 8) {
        PyErr_SetString(PyExc_ValueError, "victim_runs(): arrays of inconsistent lengths");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {   /* check everything before changing anything */
        if (victims[i] < 0 || (victims[i] + 1) * 512 > table || npages[i] < 0 || npages[i] > 512) {
            PyErr_SetString(PyExc_IndexError, "victim_runs(): a victim lies outside the page table");
            goto done;
        }
    }
    Py_ssize_t runs = sim_victim_runs(state, victims, npages, n, (uint8_t)g, starts, lengths, owner);
    result = PyLong_FromSsize_t(runs);
done:
    sim_release(v, held, NBUF);
    return result;
}

PyMethodDef sim_victim_runs_method = {"victim_runs", (PyCFunction)(void (*)(void))victim_runs, METH_FASTCALL,
                                      runs_doc};
PyMethodDef sim_clock_method = {"clock_by_victim", (PyCFunction)(void (*)(void))clock_by_victim, METH_FASTCALL,
                                clock_doc};
