#include "wg_py.h"
PyMethodDef wg_py_frames_methods[] = {{NULL, NULL, 0, NULL}};
