/* A plain fault batch on a GPU, compiled: FaultEngine._service for a plain batch, with FIFO eviction.
 *
 * The batch: distinct faulting pages with no advice, no remote mapping and one copy each, none of it on the
 * faulting GPU; the prefetched neighbours are not ReadMostly; no thrashing state anywhere. Then every rule of
 * _service but the migration to the faulter is moot (no advice, duplicate, remote mapping or thrashing state):
 * its chunks are claimed (evicting FIFO's head where none is free), its pages and the density prefetcher's
 * copied or populated, its records written and its time added as _service does it, giving the same records,
 * clock (the same float operations in the same order), state and counters.
 *
 * Where anything else holds (a victim with a duplicate, a block the thrashing detector would start to watch,
 * an empty block preferring this GPU), it changes nothing and says so; FaultEngine._service then takes the batch.
 */
#include "_simcore.h"

/* Work space kept from call to call: a fresh allocation of this size costs a page fault a page, which is more
 * than the batch. The interpreter lock is held throughout a call, so one set serves every caller. */
enum { W_BLOCKS, W_LANES, W_EXTRA, W_VICTIMS, W_SCRATCH, W_RECORDS, W_MIGRATED, W_MERGE, W_CLOCK, W_PER, W_CLAIMED,
       W_KEYS, W_VICTIM_PAGES, NWORK };
static void *work[NWORK];
static size_t work_size[NWORK];

static void *space(int slot, size_t bytes) {
    if (bytes > work_size[slot]) {
        size_t size = bytes < 4096 ? 4096 : bytes + bytes / 2;
        void *p = PyMem_Realloc(work[slot], size);
        if (!p) { PyErr_NoMemory(); return NULL; }
        work[slot] = p;
        work_size[slot] = size;
    }
    return work[slot];
}

/* Merge two sorted, disjoint arrays into out; returns the length. */
static Py_ssize_t merge(const int64_t *a, Py_ssize_t na, const int64_t *b, Py_ssize_t nb, int64_t *out) {
    Py_ssize_t i = 0, j = 0, k = 0;
    while (i < na && j < nb) out[k++] = a[i] < b[j] ? a[i++] : b[j++];
    while (i < na) out[k++] = a[i++];
    while (j < nb) out[k++] = b[j++];
    return k;
}

static int in_sorted(const int64_t *a, Py_ssize_t n, int64_t x) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (a[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo < n && a[lo] == x;
}

/* Runs of consecutive sorted pages, split where a block ends: engine.block_runs. */
static Py_ssize_t block_runs(const int64_t *p, Py_ssize_t n) {
    if (n < 2) return n;
    Py_ssize_t runs = 1;
    for (Py_ssize_t i = 1; i < n; i++) runs += (p[i] != p[i - 1] + 1) | ((p[i] & (PAGES - 1)) == 0);
    return runs;
}

enum {  /* costs[] */
    C_BATCH, C_BLOCK, C_FAULT, C_WRITE, C_POPULATE_BW, C_PAGE, C_UNMAP, C_UNMAP_RUN, C_CHUNK, C_EVICTION_WAIT, NCOSTS
};
enum {  /* codes[]: the schema's numbers */
    K_HTOD, K_DTOH, K_GPU_FAULT, K_COHERENCE, K_PREFETCH, K_EVICTION, K_READ, K_WRITE, K_STREAM, NCODES
};
enum {  /* counters[]: GpuMemory's, read and written */
    M_CAPACITY, M_USED, M_PINNED, M_TICK, M_EVICTED, NCOUNTERS
};
PyDoc_STRVAR(service_doc,
"service_plain(state, read_mostly, preferred, accessed_by, remote, chunk, block_pages, block_address,\n"
"              block_alloc, last_use, pages, wr, costs, htod_seconds, eviction_seconds, codes, counters, clock,\n"
"              processor, threshold, order, note_processor, note_time, lapse, tail, filled)\n--\n\n"
"FaultEngine._service for a plain batch on a GPU with FIFO eviction. The page table's arrays as they are;\n"
"pages (int64, sorted, distinct) and wr (bool) the batch; costs, codes, counters and clock (float64 [1]) as\n"
"_service.c numbers them; htod_seconds, eviction_seconds: link_seconds of runs of 0-512 pages; threshold\n"
"< 0 turns the prefetcher off; order: GpuMemory's FIFO (an OrderedDict); note_processor, note_time: the thrashing\n"
"detector's last migration into each block (int8, int64, one a block of the table at least; -2: none), or\n"
"None where it is off; tail: None or an EVENT_DTYPE array whose first filled records are taken. Returns\n"
"None, having changed nothing, where the batch is not one it takes; else (records, evictions, bytes copied,\n"
"bytes prefetched, notes added): records is how many were written to tail from filled on where they were\n"
"sure to fit, else the records as EVENT_DTYPE bytes.");

int sim_plain_open(PyObject *const *args, Py_buffer *v, int *held, plain_t *c) {
    static const sim_arg_t spec[NPLAIN] = {
        {0, 1, 1, 0, "state"}, {1, 1, 0, 0, "read_mostly"}, {2, 1, 0, 0, "preferred"}, {3, 1, 0, 0, "accessed_by"},
        {4, 1, 1, 0, "remote"}, {5, 1, 1, 0, "chunk"}, {6, 2, 0, 0, "block_pages"}, {7, 8, 0, 0, "block_address"},
        {8, 8, 0, 0, "block_alloc"}, {9, 8, 1, 0, "last_use"}, {12, 8, 0, 0, "costs"}, {13, 8, 0, 0, "htod_seconds"},
        {14, 8, 0, 0, "eviction_seconds"}, {15, 8, 0, 0, "codes"}, {16, 8, 1, 0, "counters"}, {17, 8, 1, 0, "clock"},
        {21, 1, 1, 1, "note_processor"}, {22, 8, 1, 1, "note_time"}, {24, (Py_ssize_t)sizeof(record_t), 1, 1, "tail"},
    };
    long processor = PyLong_AsLong(args[18]), threshold = PyLong_AsLong(args[19]);
    long long lapse = PyLong_AsLongLong(args[23]);
    Py_ssize_t filled = PyLong_AsSsize_t(args[25]);
    if (PyErr_Occurred()) return -1;
    if (processor < 0 || processor > 6 || (args[21] == Py_None) != (args[22] == Py_None) || filled < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "service_plain(): processor must be a GPU (0-6), the notes both arrays or None, filled >= 0");
        return -1;
    }
    if (sim_buffers(args, spec, NPLAIN, v, held) < 0) return -1;
    Py_ssize_t table = v[P_STATE].len, nblocks = v[P_CHUNK].len;
    Py_ssize_t tail_len = held[P_TAIL] ? v[P_TAIL].len / (Py_ssize_t)sizeof(record_t) : 0;
    if (v[P_READ_MOSTLY].len != table || v[P_PREFERRED].len != table || v[P_ACCESSED_BY].len != table ||
        v[P_REMOTE].len != table || table != nblocks * PAGES || v[P_BLOCK_PAGES].len != nblocks * 2 ||
        v[P_ADDRESS].len != nblocks * 8 || v[P_ALLOC].len != nblocks * 8 || v[P_LAST_USE].len != nblocks * 8 ||
        v[P_COSTS].len != NCOSTS * 8 || v[P_HTOD_S].len != (PAGES + 1) * 8 || v[P_EVICT_S].len != (PAGES + 1) * 8 ||
        v[P_CODES].len != NCODES * 8 || v[P_COUNTERS].len != NCOUNTERS * 8 || v[P_CLOCK].len != 8 ||
        (held[P_NOTE_P] && (v[P_NOTE_P].len < nblocks || v[P_NOTE_T].len != v[P_NOTE_P].len * 8)) ||
        filled > tail_len) {
        PyErr_SetString(PyExc_ValueError, "service_plain(): arrays of inconsistent lengths");
        sim_release(v, held, NPLAIN);
        return -1;
    }
    *c = (plain_t){
        .state = v[P_STATE].buf, .remote = v[P_REMOTE].buf, .chunk = v[P_CHUNK].buf,
        .read_mostly = v[P_READ_MOSTLY].buf, .accessed_by = v[P_ACCESSED_BY].buf, .preferred = v[P_PREFERRED].buf,
        .block_pages = v[P_BLOCK_PAGES].buf, .address = v[P_ADDRESS].buf, .alloc = v[P_ALLOC].buf,
        .last_use = v[P_LAST_USE].buf, .counters = v[P_COUNTERS].buf, .codes = v[P_CODES].buf,
        .costs = v[P_COSTS].buf, .htod_s = v[P_HTOD_S].buf, .evict_s = v[P_EVICT_S].buf, .clock = v[P_CLOCK].buf,
        .note_p = held[P_NOTE_P] ? v[P_NOTE_P].buf : NULL, .note_t = held[P_NOTE_T] ? v[P_NOTE_T].buf : NULL,
        .tail = held[P_TAIL] ? v[P_TAIL].buf : NULL, .tail_len = tail_len, .filled = filled, .table = table,
        .nblocks = nblocks, .processor = processor, .threshold = threshold, .lapse = lapse, .order = args[20],
    };
    return 0;
}

int sim_plain_batch(const plain_t *c, const int64_t *pages, Py_ssize_t n, const uint8_t *wr, plain_done_t *done) {
    uint8_t *state = c->state, *remote = c->remote, *chunk = c->chunk;
    const uint8_t *read_mostly = c->read_mostly, *accessed_by = c->accessed_by;
    const int8_t *preferred = c->preferred;
    const int16_t *block_pages = c->block_pages;
    const uint64_t *address = c->address, *alloc = c->alloc;
    int64_t *last_use = c->last_use, *counters = c->counters;
    const int64_t *codes = c->codes;
    const double *costs = c->costs, *htod_s = c->htod_s, *evict_s = c->evict_s;
    int8_t *note_p = c->note_p;
    int64_t *note_t = c->note_t;
    long processor = c->processor, threshold = c->threshold;
    PyObject *order = c->order;
    int status = -1;
    int64_t *blocks = NULL, *extra = NULL, *lanes_buf = NULL, *victims = NULL, *scratch = NULL;
    PyObject **keys = NULL;   /* the batch's blocks as ints, for FIFO's queue */
    Py_ssize_t nkeys = 0;
    record_t *records = NULL;
    uint8_t g = (uint8_t)(1 << (processor + 1));
    if (!n) return 0;

    /* -- is it a plain batch? (nothing changes until the victims are known to be plain too) ---------------- */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t p = pages[i];
        uint8_t st = state[p];
        if ((st & (st - 1)) || (st & g) || preferred[p] != NO_LOCATION || read_mostly[p] || accessed_by[p] ||
            remote[p]) return 0;
    }
    blocks = space(W_BLOCKS, (size_t)n * 8);
    lanes_buf = space(W_LANES, (size_t)n * 8);
    if (!blocks || !lanes_buf) return -1;
    Py_ssize_t nb = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!nb || blocks[nb - 1] != block_of(pages[i])) blocks[nb++] = block_of(pages[i]);
    int64_t capacity = counters[M_CAPACITY], used = counters[M_USED], pinned = counters[M_PINNED];
    int64_t free_blocks = capacity - used - pinned;
    Py_ssize_t queued = PyObject_Length(order);
    if (queued < 0) return -1;
    if (nb > free_blocks + queued) return 0;
    /* R5: the prefetcher's pages, block by block (every candidate eligible: checked page by page). */
    Py_ssize_t nextra = 0;
    extra = space(W_EXTRA, (size_t)nb * PAGES * 8);
    if (!extra) return -1;
    if (threshold >= 0) {
        for (Py_ssize_t f = 0, r = 0; f < n; r++) {
            int64_t b = blocks[r], first = b * PAGES;
            Py_ssize_t k = 0;
            while (f < n && block_of(pages[f]) == b) lanes_buf[k++] = pages[f++] - first;
            uint8_t empty;
            block_t blk = {state + first, preferred + first, remote + first, accessed_by + first};
            Py_ssize_t added = sim_block_region(blk, g, (int8_t)processor, lanes_buf, k, block_pages[b], threshold,
                                                NULL, first, extra + nextra, &empty);
            /* a ReadMostly page among them (looked for page by page only where the block has one) */
            if (memchr(read_mostly + first, 1, PAGES))
                for (Py_ssize_t i = nextra; i < nextra + added; i++)
                    if (read_mostly[extra[i]]) return 0;
            nextra += added;
            /* populated whole where a page prefers this GPU: the Python code's case */
            if (empty && memchr(preferred + first, (int)(int8_t)processor, PAGES)) return 0;
        }
    }
    /* R7: a block that another processor migrated into within the lapse would start thrashing state. */
    long long now0 = (long long)c->clock[0];
    if (note_p) {
        for (Py_ssize_t r = 0; r < nb; r++) {
            int64_t b = blocks[r];
            if (note_p[b] != NO_LOCATION && note_p[b] != processor && now0 - note_t[b] <= c->lapse) return 0;
        }
    }
    /* R1/R6: the chunks the batch needs; FIFO's head goes for those that are not free. */
    Py_ssize_t need = 0, nvictims = 0;
    for (Py_ssize_t r = 0; r < nb; r++) need += !chunk[blocks[r]];
    int64_t short_by = need - free_blocks;
    if (short_by > 0) {
        victims = space(W_VICTIMS, (size_t)short_by * 8);
        if (!victims) return -1;
        PyObject *it = PyObject_GetIter(order), *key;
        if (!it) return -1;
        while (nvictims < short_by && (key = PyIter_Next(it))) {
            long long b = PyLong_AsLongLong(key);
            Py_DECREF(key);
            if (b == -1 && PyErr_Occurred()) break;
            if (b < 0 || b >= c->nblocks) {
                PyErr_SetString(PyExc_IndexError, "service_plain(): a queued chunk lies outside the table");
                break;
            }
            if (!in_sorted(blocks, nb, b)) victims[nvictims++] = b;
        }
        Py_DECREF(it);
        if (PyErr_Occurred()) return -1;
        if (nvictims < short_by) return 0;
    }
    keys = space(W_KEYS, (size_t)nb * sizeof(PyObject *));
    if (!keys) return -1;
    for (; nkeys < nb; nkeys++)
        if (!(keys[nkeys] = PyLong_FromLongLong(blocks[nkeys]))) goto done;
    Py_ssize_t most = nvictims * PAGES / 2 + 1;   /* a victim's runs: every other page at most */
    scratch = space(W_SCRATCH, (size_t)(3 * most + 4 * (n + nextra) + 4) * 8);
    /* room for the records however many runs the victims hold, taken before the first change */
    if (!scratch || !space(W_RECORDS, (size_t)(most + 2 * n + 2 * nextra + 4) * sizeof(record_t))) goto done;
    int64_t *starts = scratch, *lengths = starts + most, *owner = lengths + most;
    Py_ssize_t runs = 0;
    if (nvictims) {
        int64_t *npages_v = space(W_VICTIM_PAGES, (size_t)nvictims * 8);
        if (!npages_v) goto done;
        for (Py_ssize_t i = 0; i < nvictims; i++) npages_v[i] = block_pages[victims[i]];
        /* The first change: none is made where a victim holds a duplicate (invalidated between copies: Python's). */
        runs = sim_victim_runs(state, victims, npages_v, nvictims, g, starts, lengths, owner);
        if (runs < 0) { status = 0; goto done; }
    }

    /* -- the batch is ours: records, clock, state ------------------------------------------------------------ */
    /* Straight into the log's tail where they surely fit (no copy, and no bytes object a batch), else into work
     * space: evictions, then a copy and a fault record a run of faulted or prefetched pages at most. */
    Py_ssize_t room = runs + 2 * n + 2 * nextra + 4;
    int direct = c->tail && c->tail_len - c->filled >= room;
    records = direct ? c->tail + c->filled : work[W_RECORDS];
    Py_ssize_t nrec = 0;
    double t = c->clock[0];
    Py_ssize_t new_chunks = need;
    if (nvictims) {   /* GpuMemory._evict_many, then evicted() */
        double wait = costs[C_EVICTION_WAIT];
        if (runs) {
            double *d = space(W_CLOCK, (size_t)runs * 3 * sizeof(double));
            int64_t *per = space(W_PER, (size_t)nvictims * 8);
            if (!d || !per) goto done;
            memset(per, 0, (size_t)nvictims * 8);
            for (Py_ssize_t j = 0; j < runs; j++) { d[j] = evict_s[lengths[j]] * 1e9; per[owner[j]]++; }
            double *begin = d + runs, *finish = d + 2 * runs;
            t = sim_eviction_clock(per, nvictims, d, t, wait, begin, finish);
            for (Py_ssize_t j = 0; j < runs; j++) {
                record_t *r = &records[nrec++];
                int64_t b = victims[owner[j]];
                r->kind = (uint8_t)codes[K_DTOH];
                r->flags = (uint8_t)codes[K_EVICTION];
                r->src = (int16_t)processor;
                r->dst = -1;
                r->start = (uint64_t)begin[j];
                r->end = (uint64_t)finish[j];
                r->address = address[block_of(starts[j])] + (uint64_t)((starts[j] & (PAGES - 1)) * PAGE_SIZE);
                r->bytes = r->value = (uint64_t)lengths[j] * PAGE_SIZE;
                r->alloc_id = alloc[b];
                r->stream = 0;
                r->source = 0;
            }
        } else {
            for (Py_ssize_t i = 0; i < nvictims; i++) t += wait;
        }
        for (Py_ssize_t i = 0; i < nvictims; i++) {
            int64_t b = victims[i];
            if (chunk[b]) {
                chunk[b] = 0;
                used--;
                PyObject *key = PyLong_FromLongLong(b);
                if (!key || PyObject_DelItem(order, key) < 0) { Py_XDECREF(key); goto done; }
                Py_DECREF(key);
            }
        }
        counters[M_EVICTED] += nvictims;
    }
    /* The claims, one tick each. They join FIFO's queue below, with the blocks already in it. */
    int64_t tick = counters[M_TICK];
    uint8_t *claimed = space(W_CLAIMED, (size_t)nb);
    if (!claimed) goto done;
    for (Py_ssize_t r = 0; r < nb; r++) {
        int64_t b = blocks[r];
        claimed[r] = !chunk[b];
        if (!claimed[r]) continue;
        tick++;
        chunk[b] = 1;
        last_use[b] = tick;
        used++;
    }
    /* The copies: faulted pages held elsewhere (COHERENCE), then the prefetched ones held elsewhere. */
    int64_t *moved = scratch, *ex_moved = moved + n, *ex_pop = ex_moved + nextra, *tmp = ex_pop + nextra;
    Py_ssize_t nmoved = 0, nex_moved = 0, nex_pop = 0;
    for (Py_ssize_t i = 0; i < n; i++) if (state[pages[i]]) moved[nmoved++] = pages[i];
    for (Py_ssize_t i = 0; i < nextra; i++) {
        if (state[extra[i]]) ex_moved[nex_moved++] = extra[i]; else ex_pop[nex_pop++] = extra[i];
    }
    nrec += sim_run_records(moved, nmoved, (uint8_t)codes[K_HTOD], (uint8_t)codes[K_COHERENCE], -1,
                            (int16_t)processor, (uint64_t)codes[K_STREAM], address, alloc, htod_s, VALUE_BYTES, NULL,
                            0, &t, records + nrec);
    nrec += sim_run_records(ex_moved, nex_moved, (uint8_t)codes[K_HTOD], (uint8_t)codes[K_PREFETCH], -1,
                            (int16_t)processor, (uint64_t)codes[K_STREAM], address, alloc, htod_s, VALUE_BYTES, NULL,
                            0, &t, records + nrec);
    int64_t moved_bytes = (int64_t)(nmoved + nex_moved) * PAGE_SIZE;
    /* The fault records: one per run, reads and writes apart, first-touched neighbours with the writes if any. */
    Py_ssize_t nwrites = 0;
    for (Py_ssize_t i = 0; i < n; i++) nwrites += wr[i] != 0;
    int64_t *reads = tmp, *writes = tmp + n + nextra;
    Py_ssize_t nreads = 0, nwritten = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (wr[i]) writes[nwritten++] = pages[i]; else reads[nreads++] = pages[i];
    }
    if (nex_pop) {   /* disjoint from the faulted pages, each sorted: a merge */
        int64_t *into = nwritten ? writes : reads;
        Py_ssize_t *len = nwritten ? &nwritten : &nreads;
        int64_t *copy = space(W_MERGE, (size_t)(*len + nex_pop) * 8);
        if (!copy) goto done;
        *len = merge(into, *len, ex_pop, nex_pop, copy);
        memcpy(into, copy, (size_t)*len * 8);
    }
    const int64_t *faulted = nex_pop ? pages : NULL;
    int value = nex_pop ? VALUE_FAULTED : VALUE_PAGES;
    double service = costs[C_BATCH] + costs[C_BLOCK] * (double)nb + (double)n * costs[C_FAULT] +
                     (double)nwrites * costs[C_WRITE];
    /* Every page that moves here loses its source mapping. */
    int64_t *migrated = space(W_MIGRATED, (size_t)(nmoved + nex_moved + 1) * 8);
    if (!migrated) goto done;
    Py_ssize_t nmigrated = merge(moved, nmoved, ex_moved, nex_moved, migrated);
    int64_t n_populated = (int64_t)n - nmoved + nex_pop;
    service += (double)(n_populated * PAGE_SIZE) / costs[C_POPULATE_BW] +
               (double)(moved_bytes / PAGE_SIZE) * costs[C_PAGE] + (double)(nmoved + nex_moved) * costs[C_UNMAP] +
               (double)block_runs(migrated, nmigrated) * costs[C_UNMAP_RUN] + (double)new_chunks * costs[C_CHUNK];
    nrec += sim_run_records(reads, nreads, (uint8_t)codes[K_GPU_FAULT], (uint8_t)codes[K_READ], (int16_t)processor,
                            (int16_t)processor, (uint64_t)codes[K_STREAM], address, alloc, NULL, value, faulted, n, &t,
                            records + nrec);
    nrec += sim_run_records(writes, nwritten, (uint8_t)codes[K_GPU_FAULT], (uint8_t)codes[K_WRITE],
                            (int16_t)processor, (int16_t)processor, (uint64_t)codes[K_STREAM], address, alloc, NULL,
                            value, faulted, n, &t, records + nrec);
    t += service * 1e9;
    /* State: every page here is now on this GPU only. */
    for (Py_ssize_t i = 0; i < n; i++) state[pages[i]] = g;
    /* (_service also clears their remote mapping by g, which the prefetcher never picks: nothing to do.) */
    for (Py_ssize_t i = 0; i < nextra; i++) state[extra[i]] = g;
    /* The claims queue at FIFO's tail (GpuMemory.claim), then GpuMemory.migrated_into requeues every block of the
     * batch there, in block order, with one tick: together, the batch's blocks leave the queue and join its
     * tail in block order, each with that tick. */
    tick++;
    PyObject *tick_obj = PyLong_FromLongLong(tick);
    if (!tick_obj) goto done;
    for (Py_ssize_t r = 0; r < nb; r++) {
        if ((!claimed[r] && PyObject_DelItem(order, keys[r]) < 0) || PyObject_SetItem(order, keys[r], tick_obj) < 0) {
            Py_DECREF(tick_obj);
            goto done;
        }
    }
    Py_DECREF(tick_obj);
    /* R7: the blocks that pages migrated into note it (none starts thrashing state: checked above). */
    Py_ssize_t noted = 0;
    if (note_p) {
        long long now = (long long)t;
        for (Py_ssize_t i = 0; i < nmigrated;) {   /* block by block: the next block's first page is looked up */
            int64_t b = block_of(migrated[i]);
            noted += note_p[b] == NO_LOCATION;
            note_p[b] = (int8_t)processor;
            note_t[b] = now;
            Py_ssize_t lo = i + 1, hi = nmigrated;
            while (lo < hi) {
                Py_ssize_t mid = lo + (hi - lo) / 2;
                if (block_of(migrated[mid]) == b) lo = mid + 1; else hi = mid;
            }
            i = lo;
        }
    }
    counters[M_USED] = used;
    counters[M_TICK] = tick;
    c->clock[0] = t;
    if (!direct && c->tail && c->tail_len - c->filled >= nrec) {   /* the bound was loose: they fit after all */
        memcpy(c->tail + c->filled, records, (size_t)nrec * sizeof(record_t));
        records = c->tail + c->filled;
        direct = 1;
    }
    *done = (plain_done_t){.records = records, .nrec = nrec, .evictions = nvictims, .noted = noted, .direct = direct,
                           .copied = moved_bytes, .prefetched = (int64_t)nex_moved * PAGE_SIZE};
    status = 1;
done:
    for (Py_ssize_t i = 0; i < nkeys; i++) Py_DECREF(keys[i]);
    return status;
}

static PyObject *service_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (sim_arity("service_plain", nargs, PLAIN_ARGS) < 0) return NULL;
    Py_buffer v[NPLAIN], pv[2];
    int held[NPLAIN], pheld[2];
    plain_t c;
    static const sim_arg_t batch_spec[2] = {{PLAIN_PAGES_ARG, 8, 0, 0, "pages"}, {PLAIN_WR_ARG, 1, 0, 0, "wr"}};
    if (sim_plain_open(args, v, held, &c) < 0) return NULL;
    PyObject *result = NULL;
    if (sim_buffers(args, batch_spec, 2, pv, pheld) < 0) { sim_release(v, held, NPLAIN); return NULL; }
    const int64_t *pages = pv[0].buf;
    Py_ssize_t n = pv[0].len / 8;
    if (pv[1].len != n) {
        PyErr_SetString(PyExc_ValueError, "service_plain(): arrays of inconsistent lengths");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pages[i] < 0 || pages[i] >= c.table || (i && pages[i] <= pages[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "service_plain(): pages must be sorted, distinct and in the table");
            goto done;
        }
    }
    plain_done_t d;
    int taken = sim_plain_batch(&c, pages, n, pv[1].buf, &d);
    if (taken < 0) goto done;
    if (!taken) { result = Py_NewRef(Py_None); goto done; }
    PyObject *records = d.direct ? PyLong_FromSsize_t(d.nrec)
                                 : PyByteArray_FromStringAndSize((const char *)d.records,
                                                                 d.nrec * (Py_ssize_t)sizeof(record_t));
    if (!records) goto done;
    result = Py_BuildValue("(NnLLn)", records, d.evictions, (long long)d.copied, (long long)d.prefetched, d.noted);
done:
    sim_release(pv, pheld, 2);
    sim_release(v, held, NPLAIN);
    return result;
}

PyMethodDef sim_service_method = {"service_plain", (PyCFunction)(void (*)(void))service_plain, METH_FASTCALL,
                                  service_doc};
