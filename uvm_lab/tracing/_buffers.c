/* CUPTI's activity-buffer callbacks, compiled, so that CUPTI's threads never wait for Python's GIL.
 *
 * CUPTI calls bufferRequested for an empty buffer and bufferCompleted with a full one from its own
 * threads, the threads that also read the driver's unified-memory event queue. Callbacks written in
 * Python (ctypes) must take the GIL first; while a Python thread holds it, CUPTI's thread waits, the
 * driver's queue overflows, and a window of records is lost without being counted. These two callbacks
 * take only a mutex: buffers come from a free list, completed ones go on a queue, and the collector's
 * drain thread takes them (take(): their valid bytes, copied) while holding the GIL on its own side.
 * No CUPTI header is needed: the callbacks' C signatures are all that is used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *data;
    size_t valid;
} completed_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_t buffer_size = 8u << 20;
static size_t max_queued = 64;     /* completed buffers waiting for take(), at most; beyond, CUPTI is refused */
static size_t max_spare = 8;       /* empty buffers kept for reuse */
static uint8_t **spare = NULL;     /* empty buffers of buffer_size bytes */
static size_t nspare = 0, cspare = 0;
static completed_t *queue = NULL;  /* completed buffers, oldest first */
static size_t nqueue = 0, cqueue = 0;
static uint64_t declined = 0, handed_out = 0, received = 0;

static int grow(void **items, size_t *cap, size_t need, size_t item) {
    if (need <= *cap) return 0;
    size_t cap2 = *cap ? *cap * 2 : 16;
    while (cap2 < need) cap2 *= 2;
    void *p = realloc(*items, cap2 * item);
    if (!p) return -1;
    *items = p;
    *cap = cap2;
    return 0;
}

/* CUPTI: void bufferRequested(uint8_t **buffer, size_t *size, size_t *maxNumRecords) */
static void buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    uint8_t *block = NULL;
    size_t bytes;
    pthread_mutex_lock(&lock);
    bytes = buffer_size;
    if (nqueue >= max_queued) {        /* the drain is too far behind: CUPTI drops, and counts */
        declined++;
        pthread_mutex_unlock(&lock);
        *buffer = NULL;
        *size = 0;
        *max_records = 0;
        return;
    }
    if (nspare) block = spare[--nspare];
    handed_out++;
    pthread_mutex_unlock(&lock);
    if (!block && posix_memalign((void **)&block, 8, bytes) != 0) block = NULL;
    *buffer = block;
    *size = block ? bytes : 0;
    *max_records = 0;
}

static void give_back(uint8_t *block) {
    /* the lock is held */
    if (nspare < max_spare && grow((void **)&spare, &cspare, nspare + 1, sizeof(uint8_t *)) == 0)
        spare[nspare++] = block;
    else
        free(block);
}

/* CUPTI: void bufferCompleted(CUcontext ctx, uint32_t streamId, uint8_t *buffer, size_t size, size_t validSize) */
static void buffer_completed(void *context, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)context; (void)stream; (void)size;
    if (!buffer) return;
    pthread_mutex_lock(&lock);
    if (valid && grow((void **)&queue, &cqueue, nqueue + 1, sizeof(completed_t)) == 0) {
        queue[nqueue].data = buffer;
        queue[nqueue].valid = valid;
        nqueue++;
        received++;
    } else {
        give_back(buffer);
    }
    pthread_mutex_unlock(&lock);
}

static PyObject *addresses(PyObject *self, PyObject *noargs) {
    return Py_BuildValue("(KK)", (unsigned long long)(uintptr_t)&buffer_requested,
                         (unsigned long long)(uintptr_t)&buffer_completed);
}

static PyObject *configure(PyObject *self, PyObject *args) {
    Py_ssize_t size, queued;
    if (!PyArg_ParseTuple(args, "nn:configure", &size, &queued)) return NULL;
    if (size < 4096 || size % 8 || queued < 1) {
        PyErr_Format(PyExc_ValueError, "configure(size, queued): size must be a multiple of 8 >= 4096 and "
                     "queued >= 1, got %zd and %zd", size, queued);
        return NULL;
    }
    pthread_mutex_lock(&lock);
    if ((size_t)size != buffer_size) {   /* spare buffers of the old size are no use */
        for (size_t i = 0; i < nspare; i++) free(spare[i]);
        nspare = 0;
    }
    buffer_size = (size_t)size;
    max_queued = (size_t)queued;
    pthread_mutex_unlock(&lock);
    Py_RETURN_NONE;
}

/* Every completed buffer, oldest first, as bytes (its valid part); the blocks go back to the free list. */
static PyObject *take(PyObject *self, PyObject *noargs) {
    completed_t *taken;
    size_t n;
    pthread_mutex_lock(&lock);
    taken = queue;
    n = nqueue;
    queue = NULL;
    nqueue = cqueue = 0;
    pthread_mutex_unlock(&lock);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; i < n; i++) {
        PyObject *bytes = out ? PyBytes_FromStringAndSize((const char *)taken[i].data, (Py_ssize_t)taken[i].valid)
                              : NULL;
        if (bytes) PyList_SET_ITEM(out, (Py_ssize_t)i, bytes);
        else Py_CLEAR(out);   /* out of memory: the records are lost, the blocks still go back */
    }
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n; i++) give_back(taken[i].data);
    pthread_mutex_unlock(&lock);
    free(taken);
    return out;
}

static PyObject *stats(PyObject *self, PyObject *noargs) {
    pthread_mutex_lock(&lock);
    unsigned long long d = declined, h = handed_out, r = received, q = nqueue, s = nspare;
    pthread_mutex_unlock(&lock);
    return Py_BuildValue("{sKsKsKsKsK}", "declined", d, "handed_out", h, "received", r, "queued", q, "spare", s);
}

static PyMethodDef methods[] = {
    {"addresses", addresses, METH_NOARGS,
     "addresses()\n--\n\nThe C addresses of the buffer-requested and buffer-completed callbacks, for "
     "cuptiActivityRegisterCallbacks."},
    {"configure", configure, METH_VARARGS,
     "configure(size, queued)\n--\n\nBytes per buffer handed to CUPTI, and the completed buffers that may wait "
     "for take() before CUPTI is refused new ones."},
    {"take", take, METH_NOARGS,
     "take()\n--\n\nEvery completed buffer, oldest first, as bytes (its valid part)."},
    {"stats", stats, METH_NOARGS,
     "stats()\n--\n\nCounts: buffers declined, handed out, received; queued and spare now."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_buffers", "CUPTI's activity-buffer callbacks, compiled: no GIL on CUPTI's threads.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__buffers(void) {
    return PyModule_Create(&module);
}
