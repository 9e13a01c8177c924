#include "wg_py.h"
PyMethodDef wg_py_crypto_methods[] = {{NULL, NULL, 0, NULL}};
