/* The installed build of cuforge's C launch path (see cuforge/runtime/fastlaunch.py).

   setup.py compiles this file as the optional extension cuforge.runtime._cuforge_fastlaunch.
   It is _launcher.c, included verbatim, plus one module attribute: SOURCE_SHA256, the
   SHA-256 of the _launcher.c text it was built from (setup.py passes it in as the macro
   CUFORGE_LAUNCHER_SHA256). fastlaunch.py uses the installed module only while that hash
   equals the hash of the _launcher.c beside it, so an editable install whose _launcher.c was
   edited after the build falls back to the runtime build instead of running old code.

   Like _launcher.c it needs only Python.h: the driver's cuLaunchKernel / cuLaunchKernelEx
   come in at run time as addresses, so nothing links against libcuda. */
#ifndef CUFORGE_LAUNCHER_SHA256
#error "CUFORGE_LAUNCHER_SHA256 (the SHA-256 of _launcher.c, as a string) must be defined"
#endif

#define PyInit__cuforge_fastlaunch cuforge_launcher_init
#include "_launcher.c"
#undef PyInit__cuforge_fastlaunch

PyMODINIT_FUNC PyInit__cuforge_fastlaunch(void) {
    PyObject* m = cuforge_launcher_init();
    if (m && PyModule_AddStringConstant(m, "SOURCE_SHA256", CUFORGE_LAUNCHER_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
