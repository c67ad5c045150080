"""The fault path, compiled: every driver rule and every cost term of the simulator, each in one function.

This module is the simulator. It is written in the subset of Python that numba compiles, over numpy arrays only,
and numba compiles it on first use (kept in numba's cache after that). With ``NUMBA_DISABLE_JIT=1`` the same
source runs as plain Python: slow, but the one specification, readable line by line.

The driver's rules (R1-R11, as the project's research on the UVM driver numbers them), and the one function for each:

- R1 granularities, R2 first touch: :func:`destination` (a page resident nowhere), :func:`claim` (a 2 MiB chunk
  a block).
- R3 where a faulting page goes: :func:`destination`; which processors' memory each can map (the host's, a
  peer GPU's where the platform has peer access): :func:`reach_of`.
- Several GPUs: a copy comes from the host's copy or a peer's (:func:`copy_source`), over the link between them
  (:func:`copy_kind`, :func:`by_source`: HtoD, DtoH, or DtoD on the profile's ``peer_bw``); each device has its own
  chunks, queue and evictions (row ``d`` of the memory arrays).
- R4 batching: :func:`run_stream` (the first ``batch_size`` distinct faulting pages of the next ``in_flight``
  accesses, one replay), :func:`service` (one batch, every rule in the driver's order) and
  :func:`batch_seconds` (what a batch costs); accesses that proceed cost :func:`hits`.
- R5 the density prefetcher: :func:`region` (one block's tree), :func:`eligible` (what policy lets it move) and
  :func:`prefetch_pages` (a batch's blocks).
- R6 eviction: :func:`claim`, :func:`make_room`, :func:`victim` (FIFO by last migration, or the LRU and tree
  what-ifs) and :func:`evict`.
- R7 thrashing: :func:`note_migrations` (detection), :func:`hints` (throttling and pins), :func:`reset_pages`.
- R8 explicit migration: :func:`migrate`.
- R9 access counters: :func:`count_remote`.
- R10 HMM and ATS: the platform's ``cpu_maps_gpu_memory`` (``COSTS``), in :func:`reach_of`, which
  :func:`destination` and :func:`proceeds` ask; ``pageable_memory_access`` in the backend.
- UnsetReadMostly's collapse of duplicates: :func:`collapse_duplicates`.
- R11 records: :func:`emit` (one record), :func:`emit_runs` (one a run of pages), :func:`link_time` (a copy's
  time on the size-dependent link).

State is arrays, grouped in tuples that the Python classes hold (``model.PageTable``, ``eviction.GpuMemory``,
``thrashing.ThrashingDetector``): nothing here keeps state of its own. Records go into a growing EVENT_DTYPE
array held in a one-item typed list, with their count in ``out[0]``; the clock, in ns, is ``clock[0]``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types

from ...events.schema import EVENTS_TYPE, AccessType, EventKind, MigrationCause, RemoteMapCause

__all__ = ["COSTS", "MEMORY_COUNTERS", "STATS", "THRASHING_COUNTERS", "advice_of", "claim", "migrate",
           "release_blocks", "reset_pages", "run_stream"]

_jit = njit(cache=True, nogil=True)
# Numba compiles a function once for each set of argument types it is called with, and a constant (1, True, or a
# counter that starts at 0) is a type of its own: these stand for such values, typed as any value of their kind.
ZERO, ONE = np.zeros(1, np.int64)[0], np.ones(1, np.int64)[0]
YES, NO = np.ones(1, np.bool_)[0], np.zeros(1, np.bool_)[0]

# The types of the page table's arrays and of the record buffer, for the signatures of the functions that write
# records: called with literal arguments from many places, numba would otherwise compile one of each per place.
_TABLE = types.Tuple((types.uint8[::1], types.boolean[::1], types.int8[::1], types.uint8[::1], types.uint8[::1],
                      types.uint8[::1], types.boolean[:, ::1], types.int64[:, ::1], types.int32[:, ::1],
                      types.uint64[::1], types.uint64[::1], types.int16[::1]))
_RECORDS = types.ListType(EVENTS_TYPE)

PAGES = 512          # 4 KiB pages of a 2 MiB VA block (R1)
SHIFT = 9
BIG = 16             # pages of a 64 KiB big page (R5)
PAGE_SIZE = 4096
HOST = -1
NO_LOCATION = -2

# Record kinds and causes, as the schema numbers them (numba reads globals as constants).
K_HTOD, K_DTOH = int(EventKind.HTOD), int(EventKind.DTOH)
K_CPU_FAULT, K_GPU_FAULT = int(EventKind.CPU_PAGE_FAULT), int(EventKind.GPU_PAGE_FAULT)
K_THRASHING, K_THROTTLING = int(EventKind.THRASHING), int(EventKind.THROTTLING)
K_REMOTE_MAP, K_INVALIDATE = int(EventKind.REMOTE_MAP), int(EventKind.INVALIDATE)
K_DTOD = int(EventKind.DTOD)
C_USER, C_COHERENCE = int(MigrationCause.USER), int(MigrationCause.COHERENCE)
C_PREFETCH, C_EVICTION = int(MigrationCause.PREFETCH), int(MigrationCause.EVICTION)
C_COUNTERS = int(MigrationCause.ACCESS_COUNTERS)
R_THRASHING, R_POLICY = int(RemoteMapCause.THRASHING), int(RemoteMapCause.POLICY)
R_OUT_OF_MEMORY = int(RemoteMapCause.OUT_OF_MEMORY)
A_READ, A_UNKNOWN = int(AccessType.READ), int(AccessType.UNKNOWN)

# R3's outcomes for a faulting page.
MIGRATE, DUP, POPULATE, REMOTE, POP_REMOTE, COLLAPSE, NONE = range(7)

#: The platform's costs, in the order of ``cost`` (seconds, bytes a second; see ``platform.Platform``).
COSTS = ("link_k", "fault_htod_bw", "fault_dtoh_bw", "eviction_bw", "prefetch_htod_bw", "prefetch_dtoh_bw",
         "gpu_populate_bw", "host_populate_bw", "fault_batch_latency", "fault_block_latency", "fault_latency",
         "fault_write_latency", "fault_page_latency", "fault_unmap_latency", "fault_unmap_run_latency",
         "fault_chunk_latency", "fault_eviction_latency", "cpu_fault_latency", "read_mostly_write_latency",
         "read_mostly_host_write_latency", "read_mostly_protect_latency", "read_mostly_protect_run_latency",
         "prefetch_block_latency", "cpu_maps_gpu_memory", "access_counter_migration", "access_counter_threshold",
         "fault_batch_size", "peer_bw", "peer_access")
(LINK_K, FAULT_HTOD_BW, FAULT_DTOH_BW, EVICTION_BW, PREFETCH_HTOD_BW, PREFETCH_DTOH_BW, GPU_POPULATE_BW,
 HOST_POPULATE_BW, BATCH_LAT, BLOCK_LAT, FAULT_LAT, WRITE_LAT, PAGE_LAT, UNMAP_LAT, UNMAP_RUN_LAT, CHUNK_LAT,
 EVICTION_LAT, CPU_FAULT_LAT, RM_WRITE_LAT, RM_HOST_WRITE_LAT, RM_PROTECT_LAT, RM_PROTECT_RUN_LAT, WALK_LAT,
 CPU_MAPS_GPU, COUNTER_MIGRATION, COUNTER_THRESHOLD, BATCH_SIZE, PEER_BW, PEER_ACCESS) = range(len(COSTS))

#: ``GpuMemory``'s counters, in the order of its ``counters`` array.
MEMORY_COUNTERS = ("capacity", "used", "pinned", "tick", "evicted", "head", "tail", "policy")
(M_CAPACITY, M_USED, M_PINNED, M_TICK, M_EVICTED, M_HEAD, M_TAIL, M_POLICY) = \
    range(len(MEMORY_COUNTERS))
FIFO, LRU, TREE = 0, 1, 2
TREE_LEVELS = 5

#: ``ThrashingDetector``'s counters and constants, in the order of its ``counters`` array.
THRASHING_COUNTERS = ("enabled", "slots_used", "lapse", "threshold", "pin_threshold", "nap", "pin", "epoch",
                      "max_resets")
(T_ENABLED, T_USED, T_LAPSE, T_THRESHOLD, T_PIN_THRESHOLD, T_NAP, T_PIN, T_EPOCH, T_MAX_RESETS) = \
    range(len(THRASHING_COUNTERS))

#: A stream's tallies, in the order of ``stats`` (``engine.StreamStats``'s fields).
STATS = ("accesses", "faults", "batches", "bytes_htod", "bytes_dtoh", "bytes_remote", "bytes_prefetched",
         "evictions", "throttles", "bytes_dtod")
(S_ACCESSES, S_FAULTS, S_BATCHES, S_HTOD, S_DTOH, S_REMOTE, S_PREFETCHED, S_EVICTIONS, S_THROTTLES, S_DTOD) = \
    range(len(STATS))

# What run_stream returns besides the position: done, or stopped for Python to give the thrashing detector room.
DONE, NEED_SLOTS = 0, 1

# The page table's arrays, in the order of the tuple ``PageTable.arrays()`` gives.
(T_STATE, T_READ_MOSTLY, T_PREFERRED, T_ACCESSED_BY, T_REMOTE, T_WRITABLE, T_CHUNK, T_LAST_USE, T_COUNTERS,
 T_BLOCK_ADDRESS, T_BLOCK_ALLOC, T_BLOCK_PAGES) = range(12)


@njit(types.UniTuple(types.int64, 4)(types.boolean[::1], types.int8[::1], types.uint8[::1], types.int8[::1]),
      cache=True, nogil=True)
def advice_of(read_mostly, preferred, accessed_by, last_prefetch):
    """The advice in force on every page of a range, in one pass: (1 if ReadMostly on all, the preferred location
    if all share one else NO_LOCATION, the AccessedBy bits all share, the last prefetch's destination if all share
    one else NO_LOCATION). A live view reads it for every map it shows that changed."""
    n = len(read_mostly)
    if n == 0:   # as numpy's all() of nothing: ReadMostly, and no one location
        return 1, NO_LOCATION, 0, NO_LOCATION
    all_read_mostly, shared = 1, 0xFF
    pref, last = np.int64(preferred[0]), np.int64(last_prefetch[0])
    for i in range(n):
        if not read_mostly[i]:
            all_read_mostly = 0
        shared &= accessed_by[i]
        if preferred[i] != pref:
            pref = NO_LOCATION
        if last_prefetch[i] != last:
            last = NO_LOCATION
    return all_read_mostly, pref, shared, last


@_jit
def bit(processor):
    """A processor's residency bit: 1 the host, 2 device 0, 4 device 1 ..."""
    return 1 if processor == HOST else 1 << (processor + 1)


@_jit
def lowest_gpu(bits):
    """The lowest device whose bit is in ``bits`` (device 0 if none is)."""
    gpus = bits >> 1
    d = 0
    while gpus and not gpus & 1:
        gpus >>= 1
        d += 1
    return d


@_jit
def reach_of(processor, devices, cost):
    """The residency bits of the memory ``processor`` can map: a GPU the host's, and its peers' where the platform
    has peer access; the host the GPUs' where it can map GPU memory (ATS, C2C)."""
    gpus = ((1 << (devices + 1)) - 1) & ~1
    if processor == HOST:
        return gpus if cost[CPU_MAPS_GPU] != 0 else 0
    return 1 | (gpus & ~bit(processor) if cost[PEER_ACCESS] != 0 else 0)


@_jit
def copy_source(st, processor):
    """Where a copy of a page (residency ``st``) to ``processor`` comes from: the host's copy where there is one and
    a GPU asks, else the lowest GPU holding it."""
    if processor != HOST and st & 1:
        return HOST
    return lowest_gpu(st & ~bit(processor))


@_jit
def copy_kind(src, dst):
    """The record of a copy from ``src`` to ``dst``."""
    return K_HTOD if src == HOST else K_DTOH if dst == HOST else K_DTOD


# -- records (R11) -------------------------------------------------------------------------------------------------
@_jit
def link_time(nbytes, bw_max, k):
    """Seconds for one copy of ``nbytes`` over a link of asymptote ``bw_max``: bw(s) = bw_max (2/pi) atan(k s)."""
    if nbytes <= 0:
        return 0.0
    s = float(nbytes)
    return s / (bw_max * (2 / math.pi) * math.atan(k * s / 1024.0))


@_jit
def room(rb, out, n):
    """The record buffer, grown (doubling) where ``n`` more records would not fit."""
    buf = rb[0]
    if out[0] + n > len(buf):
        bigger = np.empty(max(2 * len(buf), out[0] + n), buf.dtype)
        bigger[:out[0]] = buf[:out[0]]
        rb[0] = bigger
        buf = bigger
    return buf


@_jit
def put(buf, out, clock, kind, flags, src, dst, address, nbytes, value, alloc_id, stream, seconds, advance):
    """Write one record lasting ``seconds`` from now into ``buf`` (which has room); the clock moves past it where
    ``advance``."""
    start = clock[0]
    end = start + seconds * 1e9
    r = buf[out[0]]
    r.kind = kind
    r.flags = flags
    r.src = src
    r.dst = dst
    r.start = np.uint64(start)
    r.end = np.uint64(end)
    r.address = address
    r.bytes = nbytes
    r.value = value
    r.alloc_id = alloc_id
    r.stream = stream
    r.source = 0
    out[0] += 1
    if advance:
        clock[0] = end


@njit(types.void(_RECORDS, types.int64[::1], types.float64[::1], types.int64, types.int64, types.int64, types.int64,
                 types.uint64, types.int64, types.int64, types.uint64, types.int64, types.float64, types.boolean),
      cache=True, nogil=True)
def emit(rb, out, clock, kind, flags, src, dst, address, nbytes, value, alloc_id, stream, seconds, advance):
    """Append one record lasting ``seconds`` from now; the clock moves past it where ``advance``."""
    put(room(rb, out, ONE), out, clock, kind, flags, src, dst, address, nbytes, value, alloc_id, stream, seconds,
        advance)


@_jit
def page_address(tbl, page):
    return tbl[T_BLOCK_ADDRESS][page >> SHIFT] + np.uint64((page & (PAGES - 1)) * PAGE_SIZE)


@njit(types.float64(_TABLE, _RECORDS, types.int64[::1], types.float64[::1], types.int64[::1], types.int64,
                     types.int64, types.int64, types.int64, types.int64, types.int64, types.float64, types.float64,
                     types.float64, types.int64[::1], types.int64, types.boolean), cache=True, nogil=True)
def emit_runs(tbl, rb, out, clock, pages, n, kind, flags, src, dst, stream, bw, link_k, each, faulted, nfaulted,
              advance):
    """One record a run of consecutive ``pages[:n]`` (sorted), cut where a block ends. A copy (``bw`` > 0) lasts
    its link time, anything else ``each`` seconds; a fault record's value is how many of ``faulted[:nfaulted]``
    (sorted) it holds, or all its pages where ``nfaulted`` < 0. Returns the records' seconds."""
    if n == 0:
        return 0.0
    buf = room(rb, out, n)   # at most a record a page
    total = 0.0
    i = 0
    f = 0
    while i < n:
        j = i + 1
        while j < n and pages[j] == pages[j - 1] + 1 and pages[j] & (PAGES - 1):
            j += 1
        nbytes = (j - i) * PAGE_SIZE
        value = nbytes
        if kind in (K_CPU_FAULT, K_GPU_FAULT):
            if nfaulted < 0:
                value = j - i
            else:
                value = 0
                while f < nfaulted and faulted[f] < pages[i]:
                    f += 1
                while f < nfaulted and faulted[f] <= pages[j - 1]:
                    f += 1
                    value += 1
        seconds = link_time(nbytes, bw, link_k) if bw > 0 else each
        total += seconds
        put(buf, out, clock, kind, flags, src, dst, page_address(tbl, pages[i]), nbytes, value,
            tbl[T_BLOCK_ALLOC][pages[i] >> SHIFT], stream, seconds, advance)
        i = j
    return total


@_jit
def merged(a, na, b, nb):
    """The union of sorted, disjoint ``a[:na]`` and ``b[:nb]``, sorted."""
    out = np.empty(na + nb, np.int64)
    i = j = k = 0
    while i < na and j < nb:
        if a[i] < b[j]:
            out[k] = a[i]
            i += 1
        else:
            out[k] = b[j]
            j += 1
        k += 1
    out[k:k + na - i] = a[i:na]
    k += na - i
    out[k:k + nb - j] = b[j:nb]
    return out


@_jit
def block_runs(pages, n):
    """Runs of consecutive sorted pages, cut where a block ends: the ranges a copy unmaps (one TLB shootdown
    each)."""
    if n == 0:
        return 0
    runs = 1
    for i in range(1, n):
        if pages[i] != pages[i - 1] + 1 or not pages[i] & (PAGES - 1):
            runs += 1
    return runs


# -- R6: GPU memory, 2 MiB root chunks, eviction --------------------------------------------------------------------
# mem: (next, previous, stamp), each (devices, blocks), and the counters, (devices, MEMORY_COUNTERS): row d is device
# d's queue (a linked list over the blocks holding its chunks) and counters. The page table's chunk and last-use
# arrays are (devices, blocks) alike.
@_jit
def unlink(mem, d, b):
    nxt, prv, cnt = mem[0][d], mem[1][d], mem[3][d]
    p, q = prv[b], nxt[b]
    if p >= 0:
        nxt[p] = q
    else:
        cnt[M_HEAD] = q
    if q >= 0:
        prv[q] = p
    else:
        cnt[M_TAIL] = p
    nxt[b] = prv[b] = -2   # not queued


@_jit
def enqueue(mem, d, b, stamp):
    """Put block ``b`` at the tail of device ``d``'s queue (FIFO by last migration, R6), stamped."""
    nxt, prv, stamps, cnt = mem[0][d], mem[1][d], mem[2][d], mem[3][d]
    if nxt[b] != -2:
        unlink(mem, d, b)
    tail = cnt[M_TAIL]
    prv[b] = tail
    nxt[b] = -1
    if tail >= 0:
        nxt[tail] = b
    else:
        cnt[M_HEAD] = b
    cnt[M_TAIL] = b
    stamps[b] = stamp


@_jit
def drop(tbl, mem, d, b):
    """Give device ``d``'s chunk of block ``b`` back (its pages left the GPU, or its segment was freed)."""
    if tbl[T_CHUNK][d, b]:
        tbl[T_CHUNK][d, b] = False
        mem[3][d, M_USED] -= 1
        if mem[0][d, b] != -2:
            unlink(mem, d, b)


@_jit
def victim(tbl, mem, d, protect, mark):
    """The chunk of device ``d`` to evict: the head of its queue that the batch does not need (R6's FIFO). Under LRU
    a chunk touched since it was queued goes round again first; -1 if only protected chunks are left."""
    nxt, stamps, cnt = mem[0][d], mem[2][d], mem[3][d]
    last_use = tbl[T_LAST_USE][d]
    rounds = 0
    while True:
        b = cnt[M_HEAD]
        found = -1
        while b >= 0:
            following = nxt[b]
            if protect[b] != mark:
                if cnt[M_POLICY] != FIFO and last_use[b] > stamps[b]:
                    enqueue(mem, d, b, last_use[b])   # touched since queued: another round (lazy requeue)
                    found = -2
                    break
                return b
            b = following
        if found == -1:
            return -1
        rounds += 1
        if rounds > 4 * max(cnt[M_USED], 1):   # every chunk keeps being touched: the oldest stamp
            best, b = -1, cnt[M_HEAD]
            while b >= 0:
                if protect[b] != mark and (best < 0 or stamps[b] < stamps[best]):
                    best = b
                b = nxt[b]
            return best


@_jit
def evict(tbl, mem, d, b, rb, out, clock, cost, overlap):
    """R6: copy the pages only device ``d``'s chunk ``b`` holds back to the host (cause EVICTION), drop its copies
    of duplicated pages, give the chunk back. On the prefetch path (``overlap``) the copies run beside the refill:
    they start now and the clock stays; returns their seconds."""
    state = tbl[T_STATE]
    g = bit(d)
    lo = b * PAGES
    n = tbl[T_BLOCK_PAGES][b]
    only = np.empty(n, np.int64)
    copies = np.empty(n, np.int64)
    n_only = n_copies = 0
    for i in range(lo, lo + n):
        if state[i] == g:
            only[n_only] = i
            n_only += 1
        elif state[i] & g:
            copies[n_copies] = i
            n_copies += 1
    seconds = emit_runs(tbl, rb, out, clock, only, n_only, K_DTOH, C_EVICTION, d, HOST, 0, cost[EVICTION_BW],
                        cost[LINK_K], 0.0, only, -1, not overlap)
    if not overlap:   # a fault waits for the chunk to be unmapped and given up
        clock[0] += cost[EVICTION_LAT] * 1e9
    emit_runs(tbl, rb, out, clock, copies, n_copies, K_INVALIDATE, 0, d, d, 0, 0.0, 0.0, 0.0, copies, -1, False)
    for k in range(n_only):
        state[only[k]] = 1
    for k in range(n_copies):
        state[copies[k]] &= ~g
    drop(tbl, mem, d, b)
    mem[3][d, M_EVICTED] += 1
    return seconds


@_jit
def pre_evict(tbl, mem, d, b, protect, mark, rb, out, clock, cost, overlap):
    """The "tree" what-if: after evicting ``b``, its buddies under each aligned group of 2 .. 32 chunks of the same
    allocation go too once no more than half the group is still on the GPU."""
    chunk, alloc = tbl[T_CHUNK][d], tbl[T_BLOCK_ALLOC]
    seconds = 0.0
    for level in range(1, TREE_LEVELS + 1):
        lo = b >> level << level
        hi = min(lo + (1 << level), len(chunk))
        group = held = 0
        for c in range(lo, hi):
            if alloc[c] == alloc[b]:
                group += 1
                held += chunk[c]
        if held * 2 > group:   # the mirror of the prefetcher's "more than half": keep it
            break
        for c in range(lo, hi):
            if alloc[c] == alloc[b] and chunk[c] and protect[c] != mark:
                seconds += evict(tbl, mem, d, c, rb, out, clock, cost, overlap)
    return seconds


@_jit
def make_room(tbl, mem, d, nblocks, protect, mark, rb, out, clock, cost, overlap):
    """Evict until ``nblocks`` chunks of device ``d`` are free (R6: only when an allocation fails). Returns whether
    they are (not when only protected or pinned chunks are left) and the seconds of overlapped evictions."""
    cnt = mem[3][d]
    seconds = 0.0
    while cnt[M_CAPACITY] - cnt[M_USED] - cnt[M_PINNED] < nblocks:
        v = victim(tbl, mem, d, protect, mark)
        if v < 0:
            return False, seconds
        seconds += evict(tbl, mem, d, v, rb, out, clock, cost, overlap)
        if cnt[M_POLICY] == TREE:
            seconds += pre_evict(tbl, mem, d, v, protect, mark, rb, out, clock, cost, overlap)
    return True, seconds


@_jit
def claim(tbl, mem, d, blocks, nblocks, got, protect, mark, rb, out, clock, cost, overlap):
    """R1/R6: give each of ``blocks[:nblocks]`` a 2 MiB chunk of device ``d``, evicting as needed; ``got`` says which
    have one. Blocks marked ``mark`` in ``protect`` (those being serviced) are never victims. Returns how many chunks
    were new and the seconds of overlapped evictions."""
    chunk, cnt = tbl[T_CHUNK][d], mem[3][d]
    fresh = 0
    seconds = 0.0
    for k in range(nblocks):
        b = blocks[k]
        got[k] = chunk[b]
        if chunk[b]:
            continue
        ok, evicting = make_room(tbl, mem, d, ONE, protect, mark, rb, out, clock, cost, overlap)
        seconds += evicting
        if not ok:
            continue
        chunk[b] = True
        cnt[M_USED] += 1
        cnt[M_TICK] += 1
        enqueue(mem, d, b, cnt[M_TICK])
        tbl[T_LAST_USE][d, b] = cnt[M_TICK]
        got[k] = True
        fresh += 1
    return fresh, seconds


@_jit
def migrated_into(mem, d, blocks, nblocks):
    """Data migrated into these blocks' chunks on device ``d``: the driver requeues them at the tail (FIFO by
    migration)."""
    cnt = mem[3][d]
    cnt[M_TICK] += 1
    for k in range(nblocks):
        if mem[0][d, blocks[k]] != -2:
            enqueue(mem, d, blocks[k], cnt[M_TICK])


@_jit
def release_if_empty(tbl, mem, b):
    """Each device's chunk of block ``b`` whose pages all left that device goes back."""
    state = tbl[T_STATE]
    for d in range(tbl[T_CHUNK].shape[0]):
        if not tbl[T_CHUNK][d, b]:
            continue
        g = bit(d)
        empty = True
        for i in range(b * PAGES, b * PAGES + PAGES):
            if state[i] & g:
                empty = False
                break
        if empty:
            drop(tbl, mem, d, b)


@_jit
def release_blocks(tbl, mem, first, n):
    """A segment's blocks ``first .. first + n - 1`` were freed: their chunks go back, on every device."""
    for d in range(tbl[T_CHUNK].shape[0]):
        for b in range(first, first + n):
            drop(tbl, mem, d, b)


# -- R7: thrashing ------------------------------------------------------------------------------------------------
# thr: (counters, slot_of_block, note_processor, note_time, resets, count, last_t, last_proc, thrashing, throttles,
#       pin_loc, pin_until, dnt, period_end, last_thrash)
@_jit
def slot_for(thr, b, now):
    """Block ``b``'s thrashing state (a slot), made fresh where it has none or its epoch passed without thrashing
    (at most ``max_resets`` times)."""
    cnt, slot_of, resets = thr[0], thr[1], thr[4]
    s = slot_of[b]
    if s >= 0:
        if now - thr[14][s] > cnt[T_EPOCH] and resets[b] < cnt[T_MAX_RESETS]:
            resets[b] += 1
            clear_slot(thr, s, now)
        return s
    s = cnt[T_USED]
    cnt[T_USED] += 1
    slot_of[b] = s
    clear_slot(thr, s, now)
    return s


@_jit
def clear_slot(thr, s, now):
    thr[5][s, :] = 0
    thr[6][s, :] = -(1 << 62)
    thr[7][s, :] = NO_LOCATION
    thr[8][s, :] = False
    thr[9][s, :] = 0
    thr[10][s, :] = NO_LOCATION
    thr[11][s, :] = 0
    thr[12][s] = NO_LOCATION
    thr[13][s] = 0
    thr[14][s] = now


@_jit
def block_end(pages, n, i):
    """Where the pages of ``pages[i]``'s block end among sorted ``pages[:n]``."""
    b = pages[i] >> SHIFT
    j = i + 1
    while j < n and pages[j] >> SHIFT == b:
        j += 1
    return j


@_jit
def note_migrations(thr, pages, n, dest, now, found):
    """R7 detection: fault- and prefetch-caused migrations of sorted ``pages[:n]`` to ``dest``. A block has state
    once two processors migrated into it within ``lapse``; then a page migrating ``threshold`` times, each within
    ``lapse`` of the last, is thrashing. Writes the pages that turned hot to ``found``; returns how many."""
    cnt = thr[0]
    if not cnt[T_ENABLED]:
        return 0
    slot_of, note_p, note_t = thr[1], thr[2], thr[3]
    count, last_t, last_p, hot = thr[5], thr[6], thr[7], thr[8]
    lapse = cnt[T_LAPSE]
    k = 0
    i = 0
    while i < n:
        b = pages[i] >> SHIFT
        j = block_end(pages, n, i)
        s = slot_of[b]
        if s < 0:
            if note_p[b] != NO_LOCATION and note_p[b] != dest and now - note_t[b] <= lapse:
                s = slot_for(thr, b, now)
            note_p[b] = dest
            note_t[b] = now
        else:
            s = slot_for(thr, b, now)
        if s >= 0:
            for q in range(i, j):
                lane = pages[q] & (PAGES - 1)
                if now - last_t[s, lane] <= lapse and last_p[s, lane] != dest:
                    count[s, lane] = min(count[s, lane] + 1, 255)
                else:
                    count[s, lane] = 1
                last_t[s, lane] = now
                last_p[s, lane] = dest
                if count[s, lane] >= cnt[T_THRESHOLD] and not hot[s, lane]:
                    hot[s, lane] = True
                    thr[14][s] = now
                    found[k] = pages[q]
                    k += 1
        i = j
    return k


@_jit
def hints(thr, pages, n, processor, now, preferred, reach_all, throttle, pin):
    """R7 mitigation, for faults by ``processor`` on ``pages[:n]``: ``throttle`` (the fault waits a nap) and
    ``pin`` (the pinned location, or NO_LOCATION). A thrashing page's faults from any processor but the period's
    do-not-throttle one are throttled; after ``pin_threshold`` throttles the page is pinned instead: to its preferred
    location where every processor can reach it (``reach_all``), else to the host."""
    cnt, slot_of = thr[0], thr[1]
    hot, throttles, pin_loc, pin_until, dnt, period_end = thr[8], thr[9], thr[10], thr[11], thr[12], thr[13]
    any_pin = False
    i = 0
    while i < n:
        b = pages[i] >> SHIFT
        j = block_end(pages, n, i)
        s = slot_of[b]
        if s < 0:
            i = j
            continue
        any_hot = False
        for q in range(i, j):
            lane = pages[q] & (PAGES - 1)
            if pin_loc[s, lane] != NO_LOCATION and pin_until[s, lane] > now:
                pin[q] = pin_loc[s, lane]
                any_pin = True
            elif hot[s, lane]:
                any_hot = True
        if any_hot and now >= period_end[s]:   # a new period: the other processor may go unthrottled
            dnt[s] = processor if dnt[s] != processor else NO_LOCATION
            period_end[s] = now + cnt[T_NAP]
        if any_hot and processor != dnt[s]:
            for q in range(i, j):
                lane = pages[q] & (PAGES - 1)
                if pin[q] != NO_LOCATION or not hot[s, lane]:
                    continue
                if throttles[s, lane] >= cnt[T_PIN_THRESHOLD]:
                    loc = preferred[pages[q]] if reach_all[q] and preferred[pages[q]] != NO_LOCATION else HOST
                    pin_loc[s, lane] = loc
                    pin_until[s, lane] = now + cnt[T_PIN]
                    throttles[s, lane] = 0
                    pin[q] = loc
                    any_pin = True
                else:
                    throttle[q] = True
                    throttles[s, lane] += 1
        i = j
    return any_pin


@_jit
def reset_pages(thr, lo, hi):
    """User migrations (R8) reset the thrashing state of pages ``lo .. hi - 1``."""
    slot_of = thr[1]
    if hi <= lo:
        return
    for b in range(lo >> SHIFT, ((hi - 1) >> SHIFT) + 1):
        s = slot_of[b]
        if s < 0:
            continue
        for p in range(max(lo, b * PAGES), min(hi, b * PAGES + PAGES)):
            lane = p & (PAGES - 1)
            thr[5][s, lane] = 0
            thr[8][s, lane] = False
            thr[9][s, lane] = 0
            thr[10][s, lane] = NO_LOCATION


@_jit
def forget_blocks(thr, first, n):
    """A segment was freed: its blocks' thrashing state goes (their slots stay used until the table is reset)."""
    for b in range(first, first + n):
        thr[1][b] = -1
        thr[2][b] = NO_LOCATION
        thr[4][b] = 0


# -- R5: the density prefetcher ------------------------------------------------------------------------------------
@_jit
def region(state, g, base, npages, faulted, thrashing, threshold, whole, out):
    """R5 for the block whose first page is ``base``: the pages the faults (``faulted``, 512 lanes) bring in that
    are neither resident at ``g`` nor faulted (``whole``: all of the region), as lanes into ``out``; returns how
    many. The bitmap is the resident
    pages and the faulted ones, every 64 KiB big page holding a fault filled unless one of its pages is thrashing;
    each fault takes the largest subtree around it more than ``threshold`` percent set."""
    bitmap = np.zeros(PAGES + 1, np.int32)   # then its prefix sums
    for big in range(PAGES // BIG):
        lo = big * BIG
        grow = False
        for i in range(lo, lo + BIG):
            if faulted[i]:
                grow = True
        if grow:
            for i in range(lo, lo + BIG):
                if thrashing[i]:
                    grow = False
        for i in range(lo, min(lo + BIG, npages)):
            bitmap[i + 1] = 1 if grow or faulted[i] or state[base + i] & g else 0
    for i in range(PAGES):
        bitmap[i + 1] += bitmap[i]
    edges = np.zeros(PAGES + 1, np.int32)
    for f in range(npages):
        if not faulted[f]:
            continue
        size = PAGES   # the largest dense subtree wins: from the root down, the first one dense enough
        while size:
            lo = f & ~(size - 1)
            have = min(max(npages - lo, 0), size)
            if (bitmap[lo + size] - bitmap[lo]) * 100 > threshold * have:
                if min(lo + size, npages) > lo:
                    edges[lo] += 1
                    edges[min(lo + size, npages)] -= 1
                break
            size >>= 1
    k = 0
    inside = 0
    for i in range(npages):
        inside += edges[i]
        if inside > 0 and (whole or (not faulted[i] and not state[base + i] & g)):
            out[k] = i
            k += 1
    return k


@_jit
def eligible(tbl, page, processor, g, hot):
    """What policy lets the prefetcher move (R5): not a thrashing page, not one leaving its preferred location,
    not one kept remote by policy."""
    pref = tbl[T_PREFERRED][page]
    if pref != NO_LOCATION and pref != processor:
        return False
    if tbl[T_REMOTE][page] & g:
        return False
    if tbl[T_ACCESSED_BY][page] & g and tbl[T_STATE][page] != 0:
        return False
    return not hot


@_jit
def prefetch_pages(tbl, thr, pages, dest, m, processor, threshold, blocks, nb, extra):
    """R5 for a batch: the pages the density prefetcher adds, block by block of ``blocks[:nb]``, to those of
    ``pages[:m]`` coming to ``processor`` (``dest``), written sorted to ``extra``; returns how many. A block with
    nothing resident anywhere, faulting towards its preferred location, is populated whole."""
    state, preferred = tbl[T_STATE], tbl[T_PREFERRED]
    g = bit(processor)
    faulted = np.zeros(PAGES, np.bool_)
    calm = np.zeros(PAGES, np.bool_)   # the thrashing pages of a block with no thrashing state: none
    lanes = np.empty(PAGES, np.int64)
    ne = 0
    i = 0
    for k in range(nb):
        b = blocks[k]
        base = b * PAGES
        first_extra = ne
        any_here = False
        j = i
        while j < m and pages[j] >> SHIFT == b:
            if dest[j] in (MIGRATE, DUP, POPULATE):
                faulted[pages[j] - base] = True
                any_here = True
            j += 1
        if any_here:
            s = thr[1][b] if thr[0][T_USED] else -1
            hot = thr[8][s] if s >= 0 else calm
            npages = tbl[T_BLOCK_PAGES][b]
            got = region(state, g, base, npages, faulted, hot, threshold, NO, lanes)
            empty = True
            for lane in range(PAGES):
                if state[base + lane]:
                    empty = False
                    break
            for q in range(got):
                page = base + lanes[q]
                if eligible(tbl, page, processor, g, hot[lanes[q]]):
                    faulted[lanes[q]] = True   # taken: the whole-block pass below skips it
                    extra[ne] = page
                    ne += 1
            if empty:
                for lane in range(npages):
                    if not faulted[lane] and preferred[base + lane] == processor:
                        extra[ne] = base + lane
                        ne += 1
                extra[first_extra:ne].sort()
        for q in range(i, j):
            faulted[pages[q] - base] = False
        for q in range(first_extra, ne):
            faulted[extra[q] - base] = False
        i = j
    return ne


# -- R3: where a faulting page goes ------------------------------------------------------------------------------
@_jit
def destination(tbl, page, write, processor, g, pin, reach):
    """R3's ordered rules for one faulting page, first match wins."""
    st = tbl[T_STATE][page]
    pref = tbl[T_PREFERRED][page]
    has = st & g
    nowhere = st == 0
    duplicated = st & (st - 1)
    pinned = pin != NO_LOCATION
    # (a) ReadMostly, or already duplicated and not pinned: a read copies, a write collapses to the writer.
    if (tbl[T_READ_MOSTLY][page] or (duplicated and not pinned)) and not nowhere:
        if not write:
            return DUP
        return COLLAPSE if has else MIGRATE
    # (b) the faulting processor is the preferred location.
    if pref == processor:
        return POPULATE if nowhere else COLLAPSE if has else MIGRATE
    # (c) a thrashing pin: use the pinned location.
    if pinned:
        if pin == processor:
            return POPULATE if nowhere else MIGRATE
        return POP_REMOTE if nowhere else REMOTE
    # Can the faulting processor map memory at the preferred location? (x86: the CPU cannot map vidmem.)
    reach_pref = pref == processor or (pref != NO_LOCATION and bit(pref) & reach != 0)
    # (d) resident nowhere: the preferred location if the faulter can reach it, else the faulter (R2).
    if nowhere:
        return POP_REMOTE if pref != NO_LOCATION and reach_pref else POPULATE
    # (e) AccessedBy the faulter, which can reach the current location: map remotely.
    reach_now = st & reach != 0
    if tbl[T_ACCESSED_BY][page] & g and reach_now:
        return REMOTE
    # (f) a preferred location the faulter can reach: the data goes (or stays) there, mapped remotely.
    if pref != NO_LOCATION and reach_pref:
        return REMOTE
    # (g) otherwise: migrate to the faulting processor (a write to its own duplicate collapses).
    return COLLAPSE if has else MIGRATE


@njit(types.float64(_TABLE, _RECORDS, types.int64[::1], types.float64[::1], types.int64[::1], types.uint8[::1],
                     types.int64, types.int64, types.int64, types.int64, types.int64, types.float64[::1],
                     types.boolean, types.int64[::1]), cache=True, nogil=True)
def by_source(tbl, rb, out, clock, pages, states, n, processor, kind, flags, stream, cost, copying, stats):
    """Records of ``pages[:n]`` (sorted; ``states``, their residency before), one a run, grouped by where each
    comes from (:func:`copy_source`): copies to ``processor`` (``copying``: HtoD, DtoH or DtoD by source, each on
    its link, the clock moving past them, the bytes tallied), or ``kind`` records (a remote map or an invalidation)
    on each holder. Returns the copies' seconds."""
    if n == 0:
        return 0.0
    devices = tbl[T_CHUNK].shape[0]
    first = copy_source(states[0], processor)
    alike = True   # one source for all (one GPU, or a sweep): the pages as they are, no grouping
    for i in range(1, n):
        if copy_source(states[i], processor) != first:
            alike = False
            break
    group = pages if alike else np.empty(n, np.int64)
    seconds = 0.0
    for holder in range(-1, devices):   # the host first, then each device
        src = HOST if holder < 0 else holder
        if alike:
            k = n if src == first else ZERO
        else:
            k = ZERO
            for i in range(n):
                if copy_source(states[i], processor) == src:
                    group[k] = pages[i]
                    k += 1
        if k == 0 or src == processor:
            continue
        if not copying:
            dst = processor if kind == K_REMOTE_MAP else src
            emit_runs(tbl, rb, out, clock, group, k, kind, flags, src, dst, stream, 0.0, 0.0, 0.0, group, -1, False)
            continue
        record = copy_kind(src, processor)
        user = flags == C_USER   # cudaMemPrefetchAsync's copies run at its own rates
        if record == K_HTOD:
            bw = cost[PREFETCH_HTOD_BW] if user else cost[FAULT_HTOD_BW]
        elif record == K_DTOH:
            bw = cost[PREFETCH_DTOH_BW] if user else cost[FAULT_DTOH_BW]
        else:
            bw = cost[PEER_BW]
        seconds += emit_runs(tbl, rb, out, clock, group, k, record, flags, src, processor, stream, bw, cost[LINK_K],
                             0.0, group, -1, True)
        stats[S_HTOD if record == K_HTOD else S_DTOH if record == K_DTOH else S_DTOD] += k * PAGE_SIZE
    return seconds


@_jit
def batch_seconds(cost, host, upgrade, m, nb, n_written, n_populated, copied, unmapped, unmapped_runs, protect_runs,
                  new_chunks, protected, rm_written):
    """R4: what servicing a batch of ``m`` faults in ``nb`` blocks costs, from what it did. On a GPU: a round trip,
    a service time per block and per fault, more per written fault; on the host: one fault's time, or a mapping's
    upgrade per page (``upgrade``). Then per page populated (zero-filled), per page copied and per page whose
    source mapping changes, per source range unmapped (a TLB shootdown, ``unmapped_runs``) or write-protected for a
    duplicate (``protect_runs``), per new chunk; per page of the host's write access taken back for a duplicate
    (``protected``); per ReadMostly page a GPU write takes to the writer (``rm_written``)."""
    if host:
        seconds = cost[RM_HOST_WRITE_LAT] * m if upgrade else cost[CPU_FAULT_LAT]
    else:
        seconds = cost[BATCH_LAT] + cost[BLOCK_LAT] * nb + m * cost[FAULT_LAT] + n_written * cost[WRITE_LAT]
    populate_bw = cost[HOST_POPULATE_BW] if host else cost[GPU_POPULATE_BW]
    range_cost = unmapped_runs * cost[UNMAP_RUN_LAT] + protect_runs * cost[RM_PROTECT_RUN_LAT]
    seconds += n_populated * PAGE_SIZE / populate_bw + copied * cost[PAGE_LAT] + unmapped * cost[UNMAP_LAT] \
        + range_cost + new_chunks * cost[CHUNK_LAT]
    if protected:
        seconds += protected * cost[RM_PROTECT_LAT]
    if not host and rm_written:
        seconds += rm_written * cost[RM_WRITE_LAT]
    return seconds


@_jit
def receiving(blocks, nb, pages, dest, m, extra, ne, collapsing, out):
    """The blocks of ``blocks[:nb]`` that receive pages here: a faulted page migrating, duplicated or populated
    (``collapsing``: or collapsed) here, or a prefetched one (``pages``, ``extra`` sorted); into ``out``."""
    k = i = q = 0
    for j in range(nb):
        b = blocks[j]
        hit = False
        while i < m and pages[i] >> SHIFT == b:
            hit |= dest[i] in (MIGRATE, DUP, POPULATE) or (collapsing and dest[i] == COLLAPSE)
            i += 1
        while q < ne and extra[q] >> SHIFT < b:
            q += 1
        if hit or (q < ne and extra[q] >> SHIFT == b):
            out[k] = b
            k += 1
    return k


# -- one fault batch -----------------------------------------------------------------------------------------------
@_jit
def service(tbl, mem, thr, cost, pages, wr, m, processor, kind, stream, threshold, protect, mark, rb, out, clock,
            stats, extra):
    """Service one batch: distinct sorted ``pages[:m]``, ``wr`` their writes, faulted by ``processor``. ``extra``
    is room for the prefetched pages, a block's worth for each page (kept by the caller: a batch of scattered
    faults would otherwise ask for a fresh megabyte)."""
    state, read_mostly, preferred, writable = tbl[T_STATE], tbl[T_READ_MOSTLY], tbl[T_PREFERRED], tbl[T_WRITABLE]
    remote_map = tbl[T_REMOTE]
    host = processor == HOST
    g = bit(processor)
    devices = tbl[T_CHUNK].shape[0]
    cpu_maps_gpu = cost[CPU_MAPS_GPU] != 0
    peer_access = cost[PEER_ACCESS] != 0
    reach = reach_of(processor, tbl[T_CHUNK].shape[0], cost)
    now = clock[0]
    stats[S_BATCHES] += 1
    stats[S_FAULTS] += m
    any_write = False
    for i in range(m):
        any_write |= wr[i]
    st0 = np.empty(m, np.uint8)
    for i in range(m):
        st0[i] = state[pages[i]]
    # -- R7: throttling and pins
    pin = np.full(m, NO_LOCATION, np.int8)
    has_pin = False
    if thr[0][T_USED]:
        throttle = np.zeros(m, np.bool_)
        reach_all = np.empty(m, np.bool_)
        for i in range(m):
            pref = preferred[pages[i]]
            reach_all[i] = pref == HOST or (pref >= 0 and cpu_maps_gpu and (devices == 1 or peer_access))
        has_pin = hints(thr, pages, m, processor, np.int64(now), preferred, reach_all, throttle, pin)
        nap = thr[0][T_NAP]
        throttled = np.empty(m, np.int64)
        k = ZERO
        for i in range(m):
            if throttle[i]:
                throttled[k] = pages[i]
                k += 1
        if k:
            emit_runs(tbl, rb, out, clock, throttled, k, K_THROTTLING, 0, processor, processor, 0, 0.0, 0.0,
                      nap / 1e9, throttled, -1, False)
            clock[0] += nap   # the faults are dropped and replayed after the nap
            stats[S_THROTTLES] += k
    # -- R3: the destination of each faulting page
    dest = np.empty(m, np.int8)
    for i in range(m):
        dest[i] = destination(tbl, pages[i], wr[i], processor, g, pin[i], reach)
    # -- R5: the density prefetcher grows what comes here
    blocks = np.empty(m, np.int64)
    nb = ZERO
    for i in range(m):
        b = pages[i] >> SHIFT
        if nb == 0 or blocks[nb - 1] != b:
            blocks[nb] = b
            nb += 1
    ne = prefetch_pages(tbl, thr, pages, dest, m, processor, threshold, blocks, nb, extra) if threshold > 0 else ZERO
    ex_st = np.empty(ne, np.uint8)
    for q in range(ne):
        ex_st[q] = state[extra[q]]
    # -- R1/R6: chunks for the blocks that receive pages on a GPU
    lost_any = False
    new_chunks = 0
    if not host:
        need = np.empty(nb, np.int64)
        nn = receiving(blocks, nb, pages, dest, m, extra, ne, YES, need)
        if nn:
            for k in range(nn):
                protect[need[k]] = mark
            got = np.empty(nn, np.bool_)
            before = mem[3][processor, M_EVICTED]
            new_chunks, _ = claim(tbl, mem, processor, need, nn, got, protect, mark, rb, out, clock, cost, NO)
            stats[S_EVICTIONS] += mem[3][processor, M_EVICTED] - before
            for k in range(nn):
                if got[k]:
                    continue
                # No GPU memory can be freed (it is all cudaMalloc): map the host copy remotely instead.
                lost_any = True
                for i in range(m):
                    if pages[i] >> SHIFT == need[k] and dest[i] in (MIGRATE, DUP, POPULATE, COLLAPSE):
                        dest[i] = NONE if st0[i] == 0 else REMOTE
                kept = 0
                for q in range(ne):
                    if extra[q] >> SHIFT != need[k]:
                        extra[kept] = extra[q]
                        ex_st[kept] = ex_st[q]
                        kept += 1
                ne = kept
    # -- the changes, and their records
    moved = np.empty(m, np.int64)
    moved_st = np.empty(m, np.uint8)
    nm = ZERO
    for i in range(m):
        if dest[i] == MIGRATE or dest[i] == DUP:
            moved[nm] = pages[i]
            moved_st[nm] = st0[i]
            nm += 1
    # Prefetched neighbours take the batch's access type: a write batch moves ReadMostly pages instead of
    # duplicating them (otherwise every following write would fault again on a read-only copy).
    ex_moved = np.empty(ne, np.int64)
    ex_moved_st = np.empty(ne, np.uint8)
    ex_dup = np.zeros(ne, np.bool_)
    ex_pop = np.empty(ne, np.int64)
    rm_moved = np.empty(ne + m, np.int64)   # ReadMostly pages moved, not copied: the source's copy goes
    rm_st = np.empty(ne + m, np.uint8)
    nxm = npop = nrm = ZERO
    for q in range(ne):
        if ex_st[q] != 0:
            ex_moved[nxm] = extra[q]
            ex_moved_st[nxm] = ex_st[q]
            nxm += 1
            if read_mostly[extra[q]]:
                if any_write:
                    rm_moved[nrm] = extra[q]
                    rm_st[nrm] = ex_st[q]
                    nrm += 1
                else:
                    ex_dup[q] = True
        else:
            ex_pop[npop] = extra[q]
            npop += 1
    # The source's mapping changes for a migration (unmapped) and for a duplicate its holder may write (write
    # revoked); a duplicate of a read-only page leaves it alone. The host's write access taken back costs apart.
    dups = np.empty(m + ne, np.int64)
    dups_st = np.empty(m + ne, np.uint8)
    nd = ZERO
    for i in range(m):
        if dest[i] == DUP:
            dups[nd] = pages[i]
            dups_st[nd] = st0[i]
            nd += 1
    for q in range(ne):
        if ex_dup[q]:
            dups[nd] = extra[q]
            dups_st[nd] = ex_st[q]
            nd += 1
    if nd > 1:
        order = np.argsort(dups[:nd])
        dups, dups_st = dups[:nd][order], dups_st[:nd][order]
    protected = protected_host = 0
    for q in range(nd):
        src = copy_source(dups_st[q], processor)
        if writable[dups[q]] & bit(src):
            protected += 1
            protected_host += src == HOST
    unmapped = nm + nxm - nd + protected
    by_source(tbl, rb, out, clock, moved, moved_st, nm, processor, K_HTOD, C_COHERENCE, stream, cost, YES, stats)
    by_source(tbl, rb, out, clock, ex_moved, ex_moved_st, nxm, processor, K_HTOD, C_PREFETCH, stream, cost, YES,
              stats)
    stats[S_PREFETCHED] += nxm * PAGE_SIZE
    if host and any_write:   # a host write moves a ReadMostly page: its fault record cannot say "write"
        for i in range(m):
            if dest[i] == MIGRATE and wr[i] and read_mostly[pages[i]]:
                rm_moved[nrm] = pages[i]
                rm_st[nrm] = st0[i]
                nrm += 1
        if nrm > 1:
            order = np.argsort(rm_moved[:nrm])
            rm_moved, rm_st = rm_moved[:nrm][order], rm_st[:nrm][order]
    by_source(tbl, rb, out, clock, rm_moved, rm_st, nrm, processor, K_INVALIDATE, 0, 0, cost, NO, stats)
    collapse = np.empty(m, np.int64)
    nc = ZERO
    for i in range(m):
        if dest[i] == COLLAPSE:
            collapse[nc] = pages[i]
            nc += 1
    if nc:   # a write to a read-duplicated page: the other copies go, the host's first, then each device's
        for holder in range(-1, devices):   # the host first, then each device
            q = HOST if holder < 0 else holder
            qb = bit(q)
            if qb == g:
                continue
            drop_pages = np.empty(nc, np.int64)
            k = ZERO
            for i in range(nc):
                if state[collapse[i]] & qb:
                    drop_pages[k] = collapse[i]
                    k += 1
            emit_runs(tbl, rb, out, clock, drop_pages, k, K_INVALIDATE, 0, q, q, 0, 0.0, 0.0, 0.0, drop_pages, -1,
                      False)
    remote_pages = np.empty(m, np.int64)
    remote_st = np.empty(m, np.uint8)   # where each is mapped from: where it is, or where it is first touched
    nr = ZERO
    for i in range(m):
        if dest[i] == REMOTE or dest[i] == POP_REMOTE:
            remote_pages[nr] = pages[i]
            where = preferred[pages[i]] if pin[i] == NO_LOCATION else pin[i]
            remote_st[nr] = st0[i] if dest[i] == REMOTE else bit(where) if where >= 0 else 1
            nr += 1
    if nr:
        cause = R_OUT_OF_MEMORY if lost_any else R_THRASHING if has_pin else R_POLICY
        by_source(tbl, rb, out, clock, remote_pages, remote_st, nr, processor, K_REMOTE_MAP, cause, 0, cost, NO,
                  stats)
    # Fault records: one a run of faulted or first-touched pages, reads and writes apart; first-touched
    # neighbours ride with the writes if there are any.
    reads = np.empty(m + npop, np.int64)
    writes = np.empty(m + npop, np.int64)
    n_reads = n_writes = n_populated = ZERO
    for i in range(m):
        d = dest[i]
        if d in (POPULATE, POP_REMOTE):
            n_populated += 1
        if d == NONE:
            continue
        if wr[i]:
            writes[n_writes] = pages[i]
            n_writes += 1
        else:
            reads[n_reads] = pages[i]
            n_reads += 1
    n_populated += npop
    if npop:
        if n_writes:
            writes = merged(writes, n_writes, ex_pop, npop)
            n_writes += npop
        else:
            reads = merged(reads, n_reads, ex_pop, npop)
            n_reads += npop
    fault_kind = K_CPU_FAULT if host else K_GPU_FAULT
    nfaulted = m if npop else -1
    emit_runs(tbl, rb, out, clock, reads, n_reads, fault_kind, A_UNKNOWN if host else A_READ, processor, processor,
              stream, 0.0, 0.0, 0.0, pages, nfaulted, False)
    emit_runs(tbl, rb, out, clock, writes, n_writes, fault_kind, A_UNKNOWN if host else kind, processor, processor,
              stream, 0.0, 0.0, 0.0, pages, nfaulted, False)
    # -- what the batch costs (R4)
    upgrade = host and ne == 0   # a host write to a ReadMostly page it alone holds: only the mapping changes
    n_written = rm_written = 0
    for i in range(m):
        upgrade &= dest[i] == COLLAPSE and st0[i] == g
        n_written += wr[i]
        rm_written += read_mostly[pages[i]] and wr[i] and (dest[i] == MIGRATE or dest[i] == COLLAPSE)
    # The source ranges a migration unmaps, and apart from them the host's ranges write-protected for duplicates.
    migrated = merged(moved, nm, ex_moved, nxm)
    unmapped_pages = np.empty(nm + nxm, np.int64)
    rw_dups = np.empty(nd, np.int64)
    nu = nrw = 0
    d = 0
    for q in range(nm + nxm):   # migrated pages but read-only duplicates; the host's read-write ones apart
        page = migrated[q]
        while d < nd and dups[d] < page:
            d += 1
        is_dup = d < nd and dups[d] == page
        src = copy_source(dups_st[d], processor) if is_dup else HOST
        if is_dup and not writable[page] & bit(src):
            continue
        if is_dup and src == HOST:
            rw_dups[nrw] = page
            nrw += 1
        else:
            unmapped_pages[nu] = page
            nu += 1
    clock[0] += batch_seconds(cost, host, upgrade, m, nb, n_written, n_populated, nm + nxm, unmapped,
                              block_runs(unmapped_pages, nu), block_runs(rw_dups, nrw), new_chunks,
                              protected_host, rm_written + nrm if any_write else 0) * 1e9
    # -- the page table
    for i in range(m):
        page, dd = pages[i], dest[i]
        if dd in (MIGRATE, POPULATE, COLLAPSE):
            state[page] = g
            if any_write and read_mostly[page] and wr[i]:
                writable[page] = g
        elif dd == DUP:
            state[page] |= g
            writable[page] = 0
        elif dd == POP_REMOTE:
            pref = preferred[page] if pin[i] == NO_LOCATION else pin[i]
            state[page] = bit(pref) if pref >= 0 else 1
        if dd in (REMOTE, POP_REMOTE):
            remote_map[page] |= g
        elif dd in (MIGRATE, DUP, POPULATE):
            remote_map[page] &= ~g
    for q in range(ne):
        page = extra[q]
        if ex_dup[q]:
            state[page] |= g
            writable[page] = 0
        else:
            state[page] = g
            if any_write and read_mostly[page]:
                writable[page] = g
        remote_map[page] &= ~g
    if not host:
        arrived = np.empty(nb, np.int64)
        migrated_into(mem, processor, arrived, receiving(blocks, nb, pages, dest, m, extra, ne, NO, arrived))
    if host or devices > 1:   # the chunks of the devices the pages left
        for k in range(nb):
            release_if_empty(tbl, mem, blocks[k])
    # R7: migrations caused by faults and the prefetcher feed the detector.
    if thr[0][T_ENABLED] and nm + nxm:
        found = np.empty(nm + nxm, np.int64)
        k = note_migrations(thr, migrated, nm + nxm, processor, np.int64(clock[0]), found)
        if k:   # in the order of migrated: sorted
            emit_runs(tbl, rb, out, clock, found, k, K_THRASHING, 0, processor, processor, 0, 0.0, 0.0, 0.0,
                      found, -1, False)


# -- R9: access counters -----------------------------------------------------------------------------------------
@_jit
def count_remote(tbl, mem, thr, cost, page, processor, protect, mark, rb, out, clock, stats, stream):
    """One remote access by a GPU: its 2 MiB region's counter; past the threshold the region migrates (serviced as
    a prefetch-type access: a preferred location elsewhere keeps the data there)."""
    b = page >> SHIFT
    counters = tbl[T_COUNTERS][processor]
    counters[b] += 1
    if counters[b] < cost[COUNTER_THRESHOLD]:
        return
    counters[b] = 0
    state, g = tbl[T_STATE], bit(processor)
    lo = b * PAGES
    n = tbl[T_BLOCK_PAGES][b]
    move = np.empty(n, np.int64)
    move_st = np.empty(n, np.uint8)
    k = ZERO
    for i in range(lo, lo + n):
        if not state[i] & g and state[i] != 0 and tbl[T_PREFERRED][i] != HOST:
            move[k] = i
            move_st[k] = state[i]
            k += 1
    if not k:
        return
    protect[b] = mark
    one = np.full(1, b, np.int64)
    got = np.empty(1, np.bool_)
    claim(tbl, mem, processor, one, ONE, got, protect, mark, rb, out, clock, cost, NO)
    if not got[0]:
        return
    by_source(tbl, rb, out, clock, move, move_st, k, processor, K_HTOD, C_COUNTERS, stream, cost, YES, stats)
    for q in range(k):
        p = move[q]
        if tbl[T_READ_MOSTLY][p]:
            state[p] |= g
            tbl[T_WRITABLE][p] = 0
        else:
            state[p] = g
        tbl[T_REMOTE][p] &= ~g
    migrated_into(mem, processor, one, ONE)


# -- R4: a stream of accesses --------------------------------------------------------------------------------------
@_jit
def proceeds(tbl, page, write, g, reach):
    """How an access by the processor with bit ``g`` proceeds: 1 on a local copy (one it may write, for a write),
    2 through a mapping of a copy it can reach (one whose holder's bit is in ``reach``), 0 it faults.
    A write to a read-only mapping faults: a duplicate's, or a ReadMostly page's that its holder has not written
    since the advice or the last duplication."""
    st = tbl[T_STATE][page]
    if st & g and not (write and (st != g or (tbl[T_READ_MOSTLY][page] and not tbl[T_WRITABLE][page] & g))):
        return 1
    if (tbl[T_ACCESSED_BY][page] | tbl[T_REMOTE][page]) & g and st & reach and not st & g:
        return 2
    return 0


@_jit
def new_blocks(thr, pages, n):
    """How many blocks of sorted ``pages[:n]`` have no thrashing state: the slots a batch may need."""
    count, last = 0, -1
    for i in range(n):
        b = pages[i] >> SHIFT
        if b != last and thr[1][b] < 0:
            count += 1
        last = b
    return count


@_jit
def run_stream(tbl, mem, thr, cost, pages, writes, pos, processor, in_flight, local_read, local_write, remote,
               bytes_per_access, kind, stream, threshold, protect, marks, rb, out, clock, stats, remote_s):
    """Run the accesses ``pages[pos:]`` by ``processor`` (``writes``: one flag each, or one for all), in order.

    An access that proceeds costs its bytes: ``local_read``/``local_write`` seconds on a local copy, ``remote``
    through a mapping (remote writes go the other way over the full-duplex link: their time is kept apart in
    ``remote_s[1]``, the reads' in ``remote_s[0]``, for the caller to weigh at the stream's end). At a fault the
    batch is the first ``batch_size`` distinct faulting pages among the next ``in_flight`` accesses, serviced
    together with one replay (R4); then the faulted accesses proceed. Returns ``(DONE, n)``, or ``(NEED_SLOTS,
    pos)`` where the thrashing detector must be given more slots before the batch at ``pos`` can be serviced.
    """
    n = len(pages)
    one_flag = len(writes) == 1
    host = processor == HOST
    g = bit(processor)
    reach = reach_of(processor, tbl[T_CHUNK].shape[0], cost)
    batch_size = 1 if host else int(cost[BATCH_SIZE])
    counters = not host and cost[COUNTER_MIGRATION] != 0
    lru = mem[3][0, M_POLICY] != FIFO
    slots = thr[5].shape[0]
    window = np.empty(in_flight, np.int8)
    uniq = np.empty(batch_size, np.int64)
    wpages = np.empty(batch_size, np.bool_)
    cap = 4
    while cap < 4 * batch_size:
        cap *= 2
    seen = np.full(cap, -1, np.int64)   # an open-addressing set of the batch's pages (index into uniq)
    extra = np.empty(batch_size * PAGES, np.int64)
    while pos < n:
        # The accesses that proceed, up to the first that cannot.
        n_local_read = n_local_write = n_remote_read = n_remote_write = 0
        i = pos
        while i < n:
            w = writes[0] if one_flag else writes[i]
            how = proceeds(tbl, pages[i], w, g, reach)
            if how == 0:
                break
            if how == 1:
                if w:
                    n_local_write += 1
                else:
                    n_local_read += 1
            else:
                if w:
                    n_remote_write += 1
                else:
                    n_remote_read += 1
                if counters:
                    count_remote(tbl, mem, thr, cost, pages[i], processor, protect, marks[0] + 1, rb, out, clock,
                                 stats, stream)
                    marks[0] += 1
            if lru and not host:
                tbl[T_LAST_USE][processor, pages[i] >> SHIFT] = mem[3][processor, M_TICK] + 1
            i += 1
        if i > pos:
            hits(clock, stats, remote_s, n_local_read, n_local_write, n_remote_read, n_remote_write, local_read,
                 local_write, remote, bytes_per_access)
            if lru and not host:
                mem[3][processor, M_TICK] += 1
        pos = i
        if pos >= n:
            break
        # The batch: the first batch_size distinct faulting pages among the next in_flight accesses.
        end = min(n, pos + in_flight)
        seen[:] = -1
        k = ZERO
        cut = end
        for j in range(pos, end):
            w = writes[0] if one_flag else writes[j]
            how = proceeds(tbl, pages[j], w, g, reach)
            window[j - pos] = how
            if how:
                continue
            h = (pages[j] * 0x9E3779B1) & (len(seen) - 1)
            while seen[h] >= 0 and uniq[seen[h]] != pages[j]:
                h = (h + 1) & (len(seen) - 1)
            if seen[h] >= 0:
                wpages[seen[h]] |= w
                continue
            if k == batch_size:
                cut = j
                break
            seen[h] = k
            uniq[k] = pages[j]
            wpages[k] = w
            k += 1
        ordered = True
        for j in range(1, k):
            if uniq[j] < uniq[j - 1]:
                ordered = False
                break
        if ordered:   # a sweep's faults come in order
            batch, wbatch = uniq[:k].copy(), wpages[:k].copy()
        else:
            order = np.argsort(uniq[:k])
            batch, wbatch = uniq[:k][order], wpages[:k][order]
        if thr[0][T_ENABLED] and thr[0][T_USED] + new_blocks(thr, batch, k) > slots:
            return NEED_SLOTS, pos
        marks[0] += 1
        service(tbl, mem, thr, cost, batch, wbatch, k, processor, kind, stream, threshold, protect, marks[0], rb, out,
                clock, stats, extra)
        # The faulted accesses proceed after the replay, some through a new remote mapping.
        n_local_read = n_local_write = n_remote_read = n_remote_write = 0
        for j in range(pos, cut):
            w = writes[0] if one_flag else writes[j]
            how = window[j - pos]
            if how == 0:
                how = 2 if proceeds(tbl, pages[j], False, g, reach) == 2 else 1
            if how == 2:
                if w:
                    n_remote_write += 1
                else:
                    n_remote_read += 1
            elif w:
                n_local_write += 1
            else:
                n_local_read += 1
            if lru and not host:
                tbl[T_LAST_USE][processor, pages[j] >> SHIFT] = mem[3][processor, M_TICK] + 1
        if lru and not host:
            mem[3][processor, M_TICK] += 1
        hits(clock, stats, remote_s, n_local_read, n_local_write, n_remote_read, n_remote_write, local_read,
             local_write, remote, bytes_per_access)
        pos = cut
    return DONE, n


@_jit
def hits(clock, stats, remote_s, local_reads, local_writes, remote_reads, remote_writes, local_read, local_write,
         remote, bytes_per_access):
    """Accesses that proceed: local ones at memory speed, remote reads over the link now; remote writes go the
    other way over the link and are weighed at the stream's end."""
    clock[0] += (local_reads * local_read + local_writes * local_write + remote_reads * remote) * 1e9
    remote_s[0] += remote_reads * remote
    remote_s[1] += remote_writes * remote
    stats[S_REMOTE] += (remote_reads + remote_writes) * bytes_per_access


# -- R8: explicit migration (cudaMemPrefetchAsync) --------------------------------------------------------------------
@_jit
def migrate(tbl, mem, thr, cost, lo_all, hi_all, dst, stream, protect, marks, rb, out, clock):
    """R8: move pages ``lo_all .. hi_all - 1`` to ``dst`` block by block, populating untouched pages, evicting as
    needed (the evictions overlap the refill), skipping pages already there; ReadMostly pages get read-only
    copies. Resets their thrashing state. Returns the first page not moved, ``hi_all`` when every page was (a
    GPU full of memory that cannot be evicted stops it)."""
    state, read_mostly, writable, remote_map = tbl[T_STATE], tbl[T_READ_MOSTLY], tbl[T_WRITABLE], tbl[T_REMOTE]
    reset_pages(thr, lo_all, hi_all)
    d = bit(dst)
    to_host = dst == HOST
    one = np.empty(1, np.int64)
    got = np.empty(1, np.bool_)
    tally = np.zeros(len(STATS), np.int64)   # a prefetch's bytes are in its records; no stream tallies them
    for b in range(lo_all >> SHIFT, ((hi_all - 1) >> SHIFT) + 1):
        lo, hi = max(lo_all, b * PAGES), min(hi_all, (b + 1) * PAGES)
        clock[0] += cost[WALK_LAT] * 1e9   # the driver walks every block of the range
        copy = np.empty(hi - lo, np.int64)
        copy_st = np.empty(hi - lo, np.uint8)
        n_copy = n_populate = ZERO
        for p in range(lo, hi):
            st = state[p]
            if st & d:
                continue
            if st == 0:
                n_populate += 1
            else:
                copy[n_copy] = p
                copy_st[n_copy] = st
                n_copy += 1
        if n_copy == 0 and n_populate == 0:
            continue
        if to_host:
            by_source(tbl, rb, out, clock, copy, copy_st, n_copy, dst, K_DTOH, C_USER, stream, cost, YES, tally)
            clock[0] += n_populate * PAGE_SIZE / cost[HOST_POPULATE_BW] * 1e9
        else:
            marks[0] += 1
            protect[b] = marks[0]
            one[0] = b
            _, evicting = claim(tbl, mem, dst, one, ONE, got, protect, marks[0], rb, out, clock, cost, YES)
            if not got[0]:
                return lo
            copying = by_source(tbl, rb, out, clock, copy, copy_st, n_copy, dst, K_HTOD, C_USER, stream, cost, YES,
                                tally)
            clock[0] += (max(0.0, evicting - copying) + n_populate * PAGE_SIZE / cost[GPU_POPULATE_BW]) * 1e9
            for q in range(n_copy):
                if not read_mostly[copy[q]]:
                    remote_map[copy[q]] &= ~d
            migrated_into(mem, dst, one, ONE)
        for p in range(lo, hi):
            st = state[p]
            if st & d:
                continue
            if st != 0 and read_mostly[p]:
                state[p] = st | d   # ReadMostly: a copy beside the others, read-only everywhere
                writable[p] = 0
            else:
                state[p] = d        # moved (or first touched) there
        if to_host or (n_copy and tbl[T_CHUNK].shape[0] > 1):   # the chunks of the devices the pages left
            release_if_empty(tbl, mem, b)
    return hi_all


@_jit
def collapse_duplicates(tbl, mem, lo, hi, devices, rb, out, clock):
    """UnsetReadMostly on pages ``lo .. hi - 1``: a duplicated page keeps the preferred location's copy if it has
    one, else the host's; the other copies go, each device's and then the host's (recorded as invalidations)."""
    state, preferred = tbl[T_STATE], tbl[T_PREFERRED]
    dropped = np.empty(hi - lo, np.int64)
    for q in range(devices + 1):
        processor = q if q < devices else HOST   # the devices first, then the host
        g = bit(processor)
        k = ZERO
        for p in range(lo, hi):
            st = state[p]
            if not st & (st - 1) or not st & g:
                continue
            pref = preferred[p]
            keep = pref if pref != NO_LOCATION and st & bit(pref) else HOST
            if keep != processor:
                dropped[k] = p
                k += 1
        emit_runs(tbl, rb, out, clock, dropped, k, K_INVALIDATE, 0, processor, processor, 0, 0.0, 0.0, 0.0, dropped,
                  -1, False)
        for i in range(k):
            state[dropped[i]] &= ~g
    for b in range(lo >> SHIFT, ((hi - 1) >> SHIFT) + 1 if hi > lo else lo >> SHIFT):
        release_if_empty(tbl, mem, b)
