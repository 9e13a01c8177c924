/* What the parts of the extension module share: the exceptions (wangate's own
 * classes, looked up when the module loads) and each part's Python-level functions. */
#ifndef WG_PY_H
#define WG_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "wg_span.h"

/* wangate.errors.WangateError, LocalProtocolError, RemoteProtocolError */
extern PyObject *wg_WangateError;
extern PyObject *wg_LocalProtocolError;
extern PyObject *wg_RemoteProtocolError;

/* each part's functions, NULL-terminated; module.c puts them all in the module */
extern PyMethodDef wg_py_crypto_methods[];
extern PyMethodDef wg_py_frames_methods[];
extern PyMethodDef wg_py_cc_methods[];
extern PyMethodDef wg_py_shards_methods[];

/* a ShardSpan tuple: its fields into *s, its payload's buffer into *view (released by
 * the caller), its datagram count and longest datagram; 0, or -1 with an exception set */
int wg_py_span_parse(PyObject *item, wg_span *s, Py_buffer *view, size_t *count,
                     size_t *longest);

/* ready `type` and add it to `module` as `name`: 0, or -1 with an exception set */
int wg_py_add_type(PyObject *module, PyTypeObject *type, const char *name);

/* each part's types: 0 on success, -1 with an exception set */
int wg_py_add_cc_types(PyObject *module);
int wg_py_add_recovery_types(PyObject *module);
int wg_py_add_channel_types(PyObject *module);
int wg_py_add_listener_types(PyObject *module);

#endif
