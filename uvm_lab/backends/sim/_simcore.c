/* The simulator's compiled core: one module holding the functions of its C files (see _simcore.h). */
#include "_simcore.h"

static PyMethodDef methods[9];

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_simcore", "The simulator's compiled core (see uvm_lab.backends.sim).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__simcore(void) {
    methods[0] = sim_region_method;
    methods[1] = sim_victim_runs_method;
    methods[2] = sim_clock_method;
    methods[3] = sim_run_records_method;
    methods[4] = sim_service_method;
    methods[5] = sim_usable_method;
    methods[6] = sim_batch_pages_method;
    methods[7] = sim_run_plain_method;
    PyObject *m = PyModule_Create(&module);
    /* The size of the records it writes: a build from older sources is refused by its loader (compiled.py). */
    if (m && PyModule_AddIntConstant(m, "RECORD_SIZE", (long)sizeof(record_t)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
