/* The density prefetcher (research R5), compiled: the pages a fault batch's subtrees bring in.
 *
 * FaultEngine._region, block by block in C: the same rules as prefetcher.dense_subtrees (big pages that hold
 * a fault grow unless one of their pages is thrashing; the largest subtree whose count * 100 > threshold *
 * size wins; below a big page, lane by lane) and the same answer: the sorted offsets (row * 512 + lane) of
 * the region's pages that are neither resident nor faulted. Integer arithmetic only, so it is exact; the
 * numpy version stays as the fallback and as the reference the tests hold this to.
 */
#include "_simcore.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define BIG 16
#define BIGS (PAGES / BIG)

#define WORDS (PAGES / 64)

static int take(int64_t count, int64_t lo, int64_t size, int64_t n, int64_t threshold) {
    int64_t have = n - lo;
    if (have < 0) have = 0;
    if (have > size) have = size;
    return count * 100 > threshold * have;
}

#if !defined(__SSE2__)
/* Bit i of the result: byte i of p (8 bytes, each 0 or 1). */
static inline uint64_t gather8(uint64_t x) { return (x * 0x0102040810204080ULL) >> 56; }
#endif

/* Pages lo..hi of a 512-bit mask set. */
static void set_range(uint64_t *mask, int64_t lo, int64_t hi) {
    for (int64_t w = lo >> 6; w <= (hi - 1) >> 6 && lo < hi; w++) {
        int64_t a = w * 64 > lo ? w * 64 : lo, b = (w + 1) * 64 < hi ? (w + 1) * 64 : hi;
        uint64_t bits = (b - a == 64) ? ~0ULL : (((1ULL << (b - a)) - 1) << (a - w * 64));
        mask[w] |= bits;
    }
}

/* Set bits of a 16-bit value. Without -mpopcnt gcc calls libgcc for __builtin_popcountll, a call per big page
 * that took a tenth of an oversubscribed gather's time; these few operations stay inline everywhere. */
static inline int bits16(uint64_t x) {
    x = x - ((x >> 1) & 0x5555U);
    x = (x & 0x3333U) + ((x >> 2) & 0x3333U);
    x = (x + (x >> 4)) & 0x0F0FU;
    return (int)((x + (x >> 8)) & 0x1FU);
}

/* The set bits of each 16-bit quarter of a word, each in its quarter's low byte: four big pages' counts at
 * once (bits16 a big page was about a quarter of the prefetcher's time in an oversubscribed gather). */
static inline uint64_t quarters(uint64_t x) {
    x = x - ((x >> 1) & 0x5555555555555555ULL);
    x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
    return (x + (x >> 8)) & 0x001F001F001F001FULL;
}

/* Whether any page of a block has a policy that keeps the prefetcher off it (a preferred location, a remote
 * mapping, AccessedBy): where none has, a run of candidates needs no look at each page. */
static int any_policy(block_t blk) {
#if defined(__SSE2__)
    const __m128i none = _mm_set1_epi8((char)NO_LOCATION);
    __m128i acc = _mm_setzero_si128(), pref = _mm_set1_epi8(-1);
    for (int w = 0; w < PAGES / 16; w++) {
        acc = _mm_or_si128(acc, _mm_or_si128(_mm_loadu_si128((const __m128i *)(blk.remote + 16 * w)),
                                             _mm_loadu_si128((const __m128i *)(blk.accessed_by + 16 * w))));
        pref = _mm_and_si128(pref, _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(blk.preferred + 16 * w)), none));
    }
    return _mm_movemask_epi8(_mm_cmpeq_epi8(acc, _mm_setzero_si128())) != 0xFFFF || _mm_movemask_epi8(pref) != 0xFFFF;
#else
    for (int i = 0; i < PAGES; i++)
        if (blk.remote[i] || blk.accessed_by[i] || blk.preferred[i] != NO_LOCATION) return 1;
    return 0;
#endif
}

/* One block: faults at lanes[0..k) (sorted, distinct, on pages that exist). Writes the global page numbers of
 * the region's pages that are neither resident nor faulted and may be prefetched. */
Py_ssize_t sim_block_region(block_t blk, uint8_t g, int8_t processor, const int64_t *lanes, Py_ssize_t k,
                            int64_t n, int64_t threshold, const uint8_t *thrash, int64_t first_page, int64_t *out,
                            uint8_t *empty) {
    const uint8_t *state = blk.state;
    uint64_t resident[WORDS] = {0}, bitmap[WORDS], faulted[WORDS] = {0}, valid[WORDS] = {0}, region[WORDS] = {0};
    uint8_t grown[BIGS] = {0};
    int64_t prefix[BIGS + 1];
#if defined(__SSE2__)
    /* 16 pages at a time: compare each byte's bit g, and gather the 16 answers into 16 bits. */
    const __m128i gv = _mm_set1_epi8((char)g);
    __m128i anyv = _mm_setzero_si128();
    for (int w = 0; w < PAGES / 16; w++) {
        __m128i x = _mm_loadu_si128((const __m128i *)(state + 16 * w));
        anyv = _mm_or_si128(anyv, x);
        uint64_t bits = (uint64_t)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_and_si128(x, gv), gv));
        resident[w >> 2] |= bits << ((w & 3) * 16);
    }
    *empty = _mm_movemask_epi8(_mm_cmpeq_epi8(anyv, _mm_setzero_si128())) == 0xFFFF;
#else
    int shift = __builtin_ctz(g);
    uint64_t any = 0, gmask = 0x0101010101010101ULL * g;
    for (int w = 0; w < PAGES / 8; w++) {
        uint64_t x;
        memcpy(&x, state + 8 * w, 8);
        any |= x;
        resident[w >> 3] |= gather8((x & gmask) >> shift) << ((w & 7) * 8);
    }
    *empty = any == 0;
#endif
    set_range(valid, 0, n);
    for (int w = 0; w < WORDS; w++) resident[w] &= valid[w];
    for (Py_ssize_t j = 0; j < k; j++) faulted[lanes[j] >> 6] |= 1ULL << (lanes[j] & 63);
    for (int w = 0; w < WORDS; w++) bitmap[w] = resident[w] | faulted[w];
    for (Py_ssize_t j = 0; j < k; j++) {
        int64_t b = lanes[j] / BIG;
        int grows = 1;
        if (thrash) {
            for (int i = 0; i < BIG; i++) if (thrash[b * BIG + i]) { grows = 0; break; }
        }
        grown[b] = (uint8_t)grows;
    }
    prefix[0] = 0;
    for (int w = 0; w < WORDS; w++) {
        uint64_t q = quarters(bitmap[w]);
        for (int i = 0; i < 4; i++) {
            int b = 4 * w + i;
            int64_t c = (int64_t)((q >> (16 * i)) & 0xFF);
            if (grown[b]) {
                c = n - (int64_t)b * BIG;
                if (c < 0) c = 0;
                if (c > BIG) c = BIG;
            }
            prefix[b + 1] = prefix[b] + c;
        }
    }
    int64_t done_b = -1;   /* a big page whose subtree was taken: its other faults take the same one */
    for (Py_ssize_t j = 0; j < k; j++) {
        int64_t lane = lanes[j], b = lane / BIG, lo = 0, hi = 0;
        int found = 0;
        if (b == done_b) continue;
        for (int64_t size = PAGES; size >= BIG; size >>= 1) {          /* largest first: it wins */
            int64_t l = (b * BIG) & ~(size - 1);
            if (take(prefix[(l + size) / BIG] - prefix[l / BIG], l, size, n, threshold)) {
                lo = l; hi = l + size; found = 1; done_b = b;
                break;
            }
        }
        if (!found) {   /* below a big page: the big page's own pages (all that exist, where it grew) */
            int64_t first = lane & ~(int64_t)(BIG - 1);
            uint64_t own = grown[b] ? ((valid[first >> 6] >> (first & 63)) & 0xFFFFULL)
                                    : ((bitmap[first >> 6] >> (first & 63)) & 0xFFFFULL);
            for (int64_t size = BIG / 2; size >= 1; size >>= 1) {
                int64_t l = lane & ~(size - 1);
                int64_t c = bits16((own >> (l - first)) & ((1ULL << size) - 1));
                if (take(c, l, size, n, threshold)) { lo = l; hi = l + size; break; }
            }
        }
        if (hi > n) hi = lo > n ? lo : n;
        set_range(region, lo, hi);
    }
    Py_ssize_t m = 0;
    int64_t candidates = 0;
    for (int w = 0; w < WORDS; w++) {
        region[w] &= ~resident[w] & ~faulted[w] & valid[w];
        uint64_t q = quarters(region[w]);
        candidates += (int64_t)((q + (q >> 16) + (q >> 32) + (q >> 48)) & 0xFFFF);
    }
    if (!thrash && candidates > 64 && !any_policy(blk)) {   /* many pages, no policy: all of them */
        for (int w = 0; w < WORDS; w++)
            for (uint64_t bits = region[w]; bits; bits &= bits - 1) out[m++] = first_page + w * 64 + __builtin_ctzll(bits);
        return m;
    }
    for (int w = 0; w < WORDS; w++) {
        uint64_t bits = region[w];
        while (bits) {
            int64_t i = w * 64 + __builtin_ctzll(bits);
            bits &= bits - 1;
            /* Never prefetched: thrashing pages, pages leaving their preferred location, pages kept remote by
             * policy (mapped remotely, or AccessedBy this processor while resident elsewhere). */
            int8_t pref = blk.preferred[i];
            if ((thrash && thrash[i]) || (pref != NO_LOCATION && pref != processor) || (blk.remote[i] & g) ||
                ((blk.accessed_by[i] & g) && state[i] != 0)) continue;
            out[m++] = first_page + i;
        }
    }
    return m;
}

PyDoc_STRVAR(region_doc,
"region(state, preferred, remote, accessed_by, blocks, rows, lanes, npages, g, processor, threshold, thrash,\n"
"       out, empty)\n--\n\n"
"The pages the density prefetcher adds to a batch: those of the faults' dense subtrees that are neither\n"
"resident (state & g) nor faulted, and that policy lets move (no other preferred location, no remote mapping\n"
"of g, not AccessedBy g while resident somewhere, not thrashing). Writes their page numbers, sorted, to out\n"
"(int64, room for len(blocks) * 512) and returns how many; sets empty[r] (uint8) to 1 where block r has no\n"
"page resident anywhere.\n"
"state, preferred, remote, accessed_by: the page table's arrays (uint8, int8, uint8, uint8); blocks: the\n"
"batch's blocks (int64, sorted); rows, lanes: each fault's row in blocks and lane (int64, sorted by row, then\n"
"lane); npages: pages per block (int64); thrash: None or uint8 (len(blocks), 512), the pages the thrashing\n"
"detector flagged.");

static PyObject *region(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (sim_arity("region", nargs, 14) < 0) return NULL;
    long g = PyLong_AsLong(args[8]), processor = PyLong_AsLong(args[9]), threshold = PyLong_AsLong(args[10]);
    if (PyErr_Occurred()) return NULL;
    if (g <= 0 || g > 128 || (g & (g - 1)) || processor < -128 || processor > 127) {
        PyErr_Format(PyExc_ValueError, "region(): g must be one residency bit and processor an int8, got %ld, %ld",
                     g, processor);
        return NULL;
    }
    enum { STATE, PREF, REMOTE, ACC, BLOCKS, ROWS, LANES, NPAGES, THRASH, OUT, EMPTY, NBUF };
    static const sim_arg_t spec[NBUF] = {
        {0, 1, 0, 0, "state"}, {1, 1, 0, 0, "preferred"}, {2, 1, 0, 0, "remote"}, {3, 1, 0, 0, "accessed_by"},
        {4, 8, 0, 0, "blocks"}, {5, 8, 0, 0, "rows"}, {6, 8, 0, 0, "lanes"}, {7, 8, 0, 0, "npages"},
        {11, 1, 0, 1, "thrash"}, {12, 8, 1, 0, "out"}, {13, 1, 1, 0, "empty"},
    };
    Py_buffer v[NBUF];
    int held[NBUF];
    Py_ssize_t total = -1;
    if (sim_buffers(args, spec, NBUF, v, held) < 0) return NULL;
    int have_thrash = held[THRASH];
    Py_ssize_t table = v[STATE].len, nblocks = v[BLOCKS].len / 8, nfaults = v[ROWS].len / 8;
    const int64_t *blocks = v[BLOCKS].buf, *rows = v[ROWS].buf, *lanes = v[LANES].buf, *npages = v[NPAGES].buf;
    if (v[PREF].len != table || v[REMOTE].len != table || v[ACC].len != table || v[LANES].len != v[ROWS].len ||
        v[NPAGES].len != v[BLOCKS].len || v[OUT].len < nblocks * PAGES * 8 || v[EMPTY].len < nblocks ||
        (have_thrash && v[THRASH].len < nblocks * PAGES)) {
        PyErr_SetString(PyExc_ValueError, "region(): arrays of inconsistent lengths");
        goto done;
    }
    Py_ssize_t m = 0;
    memset(v[EMPTY].buf, 0, (size_t)nblocks);
    for (Py_ssize_t f = 0; f < nfaults;) {
        int64_t r = rows[f];
        Py_ssize_t end = f;
        while (end < nfaults && rows[end] == r) end++;
        int bad = r < 0 || r >= nblocks || blocks[r] < 0 || (blocks[r] + 1) * PAGES > table ||
                  npages[r] < 0 || npages[r] > PAGES;
        for (Py_ssize_t j = f; j < end && !bad; j++) bad = lanes[j] < 0 || lanes[j] >= PAGES;
        if (bad) {
            PyErr_SetString(PyExc_IndexError, "region(): a fault lies outside the page table");
            goto done;
        }
        int64_t first = blocks[r] * PAGES;
        block_t blk = {(const uint8_t *)v[STATE].buf + first, (const int8_t *)v[PREF].buf + first,
                       (const uint8_t *)v[REMOTE].buf + first, (const uint8_t *)v[ACC].buf + first};
        m += sim_block_region(blk, (uint8_t)g, (int8_t)processor, lanes + f, end - f, npages[r], threshold,
                              have_thrash ? (const uint8_t *)v[THRASH].buf + r * PAGES : NULL, first,
                              (int64_t *)v[OUT].buf + m, (uint8_t *)v[EMPTY].buf + r);
        f = end;
    }
    total = m;
done:
    sim_release(v, held, NBUF);
    return total < 0 ? NULL : PyLong_FromSsize_t(total);
}

PyMethodDef sim_region_method = {"region", (PyCFunction)(void (*)(void))region, METH_FASTCALL, region_doc};
