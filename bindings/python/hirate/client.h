/* hirate._hirate's client identity (client.c): ClientRules and the identity
 * and bucket-key functions, added to the module by module_exec. */
#ifndef HIRATE_PY_CLIENT_H
#define HIRATE_PY_CLIENT_H

#include <Python.h>

int hirate_py_client_add(PyObject *module);

#endif
