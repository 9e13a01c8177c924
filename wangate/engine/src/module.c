/* wangate.engine._engine: the module, its exceptions, and every part's functions. */
#include "wg_channel.h"
#include "wg_reader.h"
#include "wg_py.h"

PyObject *wg_WangateError;
PyObject *wg_LocalProtocolError;
PyObject *wg_RemoteProtocolError;

static struct PyModuleDef engine_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "wangate.engine._engine",
    .m_doc = "wangate's native data plane (see wangate/engine/__init__.py)",
    .m_size = -1,
};

int wg_py_add_type(PyObject *module, PyTypeObject *type, const char *name) {
    if (PyType_Ready(type) < 0) return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

static int add_methods(PyObject *module, PyMethodDef *methods) {
    /* a new reference; each function takes its own */
    PyObject *name = PyModule_GetNameObject(module);
    if (name == NULL) return -1;
    for (PyMethodDef *m = methods; m->ml_name != NULL; m++) {
        PyObject *f = PyCFunction_NewEx(m, NULL, name);
        if (f == NULL || PyModule_AddObject(module, m->ml_name, f) < 0) {
            Py_XDECREF(f);
            Py_DECREF(name);
            return -1;
        }
    }
    Py_DECREF(name);
    return 0;
}

PyMODINIT_FUNC PyInit__engine(void) {
    PyObject *errors = PyImport_ImportModule("wangate.errors");
    if (errors == NULL) return NULL;
    wg_WangateError = PyObject_GetAttrString(errors, "WangateError");
    wg_LocalProtocolError = PyObject_GetAttrString(errors, "LocalProtocolError");
    wg_RemoteProtocolError = PyObject_GetAttrString(errors, "RemoteProtocolError");
    Py_DECREF(errors);
    if (!wg_WangateError || !wg_LocalProtocolError || !wg_RemoteProtocolError) return NULL;
    PyObject *module = PyModule_Create(&engine_module);
    if (module == NULL) return NULL;
    if (PyModule_AddIntConstant(module, "CID_BYTES", WG_CID_LEN) < 0 ||
        PyModule_AddIntConstant(module, "DATAGRAM_OVERHEAD_BYTES", WG_DATAGRAM_OVERHEAD) < 0 ||
        PyModule_AddIntConstant(module, "READ_BATCH_BUFFERS", WG_READ_BATCH) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    if (add_methods(module, wg_py_crypto_methods) < 0 ||
        add_methods(module, wg_py_frames_methods) < 0 ||
        add_methods(module, wg_py_cc_methods) < 0 ||
        add_methods(module, wg_py_shards_methods) < 0 || wg_py_add_cc_types(module) < 0 ||
        wg_py_add_recovery_types(module) < 0 || wg_py_add_channel_types(module) < 0 ||
        wg_py_add_listener_types(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
