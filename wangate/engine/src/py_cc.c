#include "wg_py.h"
PyMethodDef wg_py_cc_methods[] = {{NULL, NULL, 0, NULL}};
int wg_py_add_cc_types(PyObject *module) { return 0; }
