#include "wg_py.h"
int wg_py_add_recovery_types(PyObject *module) { return 0; }
