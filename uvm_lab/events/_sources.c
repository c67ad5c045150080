/* The line of user code that is calling, compiled: uvm_lab.events.sources' frame walk, with a cache.
 *
 * capture() walks the Python frames outward from the caller and returns the source id of the first frame the
 * resolver calls the user's (uvm_lab's own frames, the standard library's and installed packages' are passed
 * over). Which frames those are, and what id a line gets, the resolver (sources._resolve, in Python) decides;
 * this file only remembers its answers, by (code object, instruction offset), so that a call from a line seen
 * before costs a lookup per frame and no Python. The cache holds a reference to each code object it keys on:
 * a freed code object's address cannot come back with another's answer.
 *
 * The pool's compiled hot path calls capture() through the capsule _C_API, with no Python call in between.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stdint.h>

#define SLOTS 4096          /* a power of two */
#define INTERNAL (-1)       /* the resolver's answer for a frame that is not the user's */

typedef struct {
    PyObject *code;         /* strong reference, or NULL for an empty slot */
    int lasti;
    int64_t answer;         /* a source id (> 0), 0 (no id: the table is full) or INTERNAL */
} slot_t;

static slot_t cache[SLOTS];
static PyObject *resolver = NULL;   /* resolver(code, lineno) -> int */
static int enabled = 1;
static int64_t acting = 0;          /* while nonzero, every capture answers it: a tool acting for the user */

static void clear_cache(void) {
    for (int i = 0; i < SLOTS; i++) {
        Py_CLEAR(cache[i].code);
    }
}

/* The resolver's answer for one frame, from the cache or asked for; -2 with an exception set on failure. */
static int64_t answer_for(PyFrameObject *f) {
    PyCodeObject *code = PyFrame_GetCode(f);
    int lasti = PyFrame_GetLasti(f);
    size_t h = (((uintptr_t)code >> 4) ^ ((uintptr_t)lasti * 0x9E3779B1u)) & (SLOTS - 1);
    slot_t *s = &cache[h];
    if (s->code == (PyObject *)code && s->lasti == lasti) {
        Py_DECREF(code);
        return s->answer;
    }
    int64_t answer = -2;
    if (resolver) {
        PyObject *r = PyObject_CallFunction(resolver, "Oi", (PyObject *)code, PyFrame_GetLineNumber(f));
        if (r) {
            answer = PyLong_AsLongLong(r);
            Py_DECREF(r);
            if (answer == -1 && PyErr_Occurred()) answer = -2;
        }
    } else {
        answer = 0;
    }
    if (answer != -2) {   /* the call may have run other threads: the slot is written only now, whole */
        slot_t *t = &cache[h];
        PyObject *old = t->code;
        t->code = (PyObject *)code;   /* the reference taken by PyFrame_GetCode moves into the slot */
        t->lasti = lasti;
        t->answer = answer;
        Py_XDECREF(old);
    } else {
        Py_DECREF(code);
    }
    return answer;
}

/* The calling user line's source id, 0 where there is none; -1 with an exception set if the resolver failed. */
static int64_t capture(void) {
    if (!enabled) return 0;
    if (acting) return acting;
    PyFrameObject *f = PyEval_GetFrame();   /* borrowed */
    Py_XINCREF(f);
    while (f) {
        int64_t answer = answer_for(f);
        if (answer == -2) {
            Py_DECREF(f);
            return -1;
        }
        if (answer != INTERNAL) {
            Py_DECREF(f);
            return answer;
        }
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    return 0;
}

static PyObject *py_capture(PyObject *self, PyObject *unused) {
    int64_t id = capture();
    if (id < 0) return NULL;
    return PyLong_FromLongLong(id);
}

static PyObject *py_set_resolver(PyObject *self, PyObject *fn) {
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_Format(PyExc_TypeError, "the resolver must be callable or None, got %R", fn);
        return NULL;
    }
    clear_cache();
    Py_XSETREF(resolver, fn == Py_None ? NULL : Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyObject *py_set_enabled(PyObject *self, PyObject *on) {
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    enabled = v;
    Py_RETURN_NONE;
}

static PyObject *py_set_acting(PyObject *self, PyObject *id) {
    long long v = PyLong_AsLongLong(id);
    if (v == -1 && PyErr_Occurred()) return NULL;
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "a source id is >= 0, got %lld", v);
        return NULL;
    }
    acting = v;
    Py_RETURN_NONE;
}

static PyObject *py_clear(PyObject *self, PyObject *unused) {
    clear_cache();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"capture", py_capture, METH_NOARGS, "capture() -> the source id of the calling user line (0 if none)"},
    {"set_resolver", py_set_resolver, METH_O, "set_resolver(fn): fn(code, lineno) -> source id, or -1 (not the user's)"},
    {"set_enabled", py_set_enabled, METH_O, "set_enabled(on): capture() returns 0 while off"},
    {"set_acting", py_set_acting, METH_O, "set_acting(id): capture() answers id while it is nonzero"},
    {"clear", py_clear, METH_NOARGS, "forget every cached answer"},
    {NULL, NULL, 0, NULL},
};

/* What other compiled modules call: capture(), as above. */
typedef struct {
    int64_t (*capture)(void);
} sources_api_t;

static sources_api_t api = {capture};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sources", "The calling user line (compiled).", -1, methods};

PyMODINIT_FUNC PyInit__sources(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyObject *capsule = PyCapsule_New(&api, "uvm_lab.events._sources._C_API", NULL);
    if (!capsule || PyModule_AddObject(m, "_C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
