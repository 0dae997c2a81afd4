/* tkaot._launch: the compiled launch path.

   One Launcher per (kernel variant, op argument order). A call
   launcher(device, stream, *values) converts the values, evaluates the grid,
   packs the kernel parameters into a stack buffer and calls cuLaunchKernel
   through the address the Python side gave it: no libcuda or libtorch link,
   no per-call allocation, no per-thread state (cuLaunchKernel copies the
   parameters before it returns). Only the CPython Limited API of 3.11 is
   used, so one abi3 .so serves 3.11 and later.

   A launcher made with pdl=1 calls cuLaunchKernelEx instead, with the
   programmatic-stream-serialization attribute (programmatic dependent
   launch: the kernel may start while the one ahead of it finishes; it waits
   for it itself, see kernels_src/pdl.py); the launch config and its one
   attribute are on the stack too.

   Values given once at construction (`constants`: eight bytes each, the value in the low bytes) follow
   the per-call values: a kernel parameter may name one, and the call copies them in with one memcpy.

   Python keeps the slow paths: `loader(device)` loads the module the first
   time a device is seen and returns (cuLaunchKernel or, for pdl,
   cuLaunchKernelEx address, CUfunction address); `on_error(launcher, result, device, stream, *values)` turns a
   non-zero CUresult into an exception (after a context retry).

   Build: see the Makefile's `ext` target. */

#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "parameters are packed little-endian, like the struct launcher's '=' format on the hosts tkaot serves"
#endif

typedef int (*launch_fn)(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                         unsigned int bz, unsigned int smem, uintptr_t stream, void **params, void **extra);

/* cuLaunchKernelEx and the parts of its config tkaot fills (cuda.h's layout: the attribute value, a 64-byte
   union, starts 8 bytes in) */
#define CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION 6
typedef struct {
    int id;
    char pad[4];
    union {
        char bytes[64];
        int programmatic_stream_serialization_allowed;
        uint64_t align;
    } value;
} launch_attribute;
typedef struct {
    unsigned int grid[3], block[3], smem;
    uintptr_t stream;
    launch_attribute *attrs;
    unsigned int num_attrs;
} launch_config;
typedef int (*launch_ex_fn)(const launch_config *config, void *f, void **params, void **extra);

/* value types: the struct codes of tkaot._kernel._PACK_CODES */
enum { V_PTR = 'Q', V_I64 = 'q', V_I32 = 'i', V_F32 = 'f' };
/* grid program: postfix, one (op, operand) pair of int64 per step, each expression closed by G_END */
enum { G_CONST = 0, G_ARG, G_ADD, G_SUB, G_MUL, G_FLOORDIV, G_MOD, G_MIN, G_MAX, G_END };

#define MAX_VALUES 128
#define MAX_CONSTANTS 8
#define MAX_GRID_STEPS 96
#define MAX_STACK 16
#define MAX_DEVICES 64

typedef struct {
    int64_t op, operand;
} grid_step;

typedef union {
    uint64_t u;
    int64_t i;
    float f;
} slot;

typedef struct {
    PyObject_HEAD
    void *launch; /* cuLaunchKernel (launch_fn) or, for pdl, cuLaunchKernelEx (launch_ex_fn); set by the first loader call */
    int pdl;
    Py_ssize_t nvalues, nparams, nsteps, nconstants;
    unsigned int block[3], smem;
    unsigned char types[MAX_VALUES];
    unsigned char param_value[MAX_VALUES]; /* kernel parameter i is value param_value[i] (past nvalues: a constant) */
    slot constants[MAX_CONSTANTS];
    grid_step grid[MAX_GRID_STEPS];
    void *functions[MAX_DEVICES]; /* CUfunction per device index, NULL until loaded */
    PyObject *loader, *on_error, *kernel, *arg_names;
} Launcher;

static int noop_launch(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                       unsigned int bz, unsigned int smem, uintptr_t stream, void **params, void **extra)
{
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)stream, (void)params, (void)extra;
    return 0;
}

static int noop_launch_ex(const launch_config *config, void *f, void **params, void **extra)
{
    (void)config, (void)f, (void)params, (void)extra;
    return 0;
}

/* ---- construction ---- */

static int check_grid(Launcher *self)
{
    int depth = 0, ends = 0;
    for (Py_ssize_t i = 0; i < self->nsteps; i++) {
        grid_step s = self->grid[i];
        switch (s.op) {
        case G_CONST:
            depth++;
            break;
        case G_ARG:
            if (s.operand < 0 || s.operand >= self->nvalues ||
                (self->types[s.operand] != V_I32 && self->types[s.operand] != V_I64)) {
                PyErr_SetString(PyExc_ValueError, "grid refers to a value that is not an integer argument");
                return -1;
            }
            depth++;
            break;
        case G_ADD: case G_SUB: case G_MUL: case G_FLOORDIV: case G_MOD: case G_MIN: case G_MAX:
            if (depth < 2) goto bad;
            depth--;
            break;
        case G_END:
            if (depth != 1) goto bad;
            depth = 0;
            ends++;
            break;
        default:
            goto bad;
        }
        if (depth > MAX_STACK) goto bad;
    }
    if (ends == 3 && depth == 0) return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "malformed grid program");
    return -1;
}

static PyObject *launcher_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"fmt", "params", "grid", "block", "smem", "loader", "on_error", "kernel", "arg_names", "pdl",
                            "constants", NULL};
    const char *fmt, *params, *grid, *constants = NULL;
    Py_ssize_t nfmt, nparams, ngrid, nconstants = 0;
    unsigned int bx, by, bz, smem;
    PyObject *loader, *on_error, *kernel = Py_None, *arg_names = Py_None;
    int pdl = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s#y#y#(III)IOO|OOpy#", names, &fmt, &nfmt, &params, &nparams, &grid, &ngrid,
                                     &bx, &by, &bz, &smem, &loader, &on_error, &kernel, &arg_names, &pdl, &constants, &nconstants))
        return NULL;
    if (nconstants % (Py_ssize_t)sizeof(slot) || nconstants / (Py_ssize_t)sizeof(slot) > MAX_CONSTANTS) {
        PyErr_Format(PyExc_ValueError, "constants must be at most %d slots of 8 bytes", MAX_CONSTANTS);
        return NULL;
    }
    nconstants /= (Py_ssize_t)sizeof(slot);
    if (nfmt + nconstants > MAX_VALUES || nparams > nfmt + nconstants || ngrid % sizeof(grid_step) ||
        ngrid / (Py_ssize_t)sizeof(grid_step) > MAX_GRID_STEPS) {
        PyErr_SetString(PyExc_ValueError, "too many values, parameters or grid steps for the compiled launcher");
        return NULL;
    }
    if (!PyCallable_Check(loader) || !PyCallable_Check(on_error)) {
        PyErr_SetString(PyExc_TypeError, "loader and on_error must be callable");
        return NULL;
    }
    Launcher *self = (Launcher *)PyType_GenericAlloc(type, 0); /* zeroed */
    if (self == NULL) return NULL;
    self->nvalues = nfmt;
    self->nparams = nparams;
    self->nconstants = nconstants;
    if (nconstants) memcpy(self->constants, constants, nconstants * sizeof(slot));
    self->nsteps = ngrid / (Py_ssize_t)sizeof(grid_step);
    self->block[0] = bx, self->block[1] = by, self->block[2] = bz, self->smem = smem;
    self->pdl = pdl;
    memcpy(self->grid, grid, ngrid);
    for (Py_ssize_t i = 0; i < nfmt; i++) {
        char c = fmt[i];
        if (c != V_PTR && c != V_I64 && c != V_I32 && c != V_F32) {
            PyErr_Format(PyExc_ValueError, "unknown value type %c (want one of Q q i f)", c);
            goto fail;
        }
        self->types[i] = (unsigned char)c;
    }
    for (Py_ssize_t i = 0; i < nparams; i++) {
        if ((unsigned char)params[i] >= nfmt + nconstants) {
            PyErr_SetString(PyExc_ValueError, "a kernel parameter refers to a value past the end");
            goto fail;
        }
        self->param_value[i] = (unsigned char)params[i];
    }
    if (check_grid(self) < 0) goto fail;
    Py_INCREF(loader), self->loader = loader;
    Py_INCREF(on_error), self->on_error = on_error;
    Py_INCREF(kernel), self->kernel = kernel;
    Py_INCREF(arg_names), self->arg_names = arg_names;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static void launcher_dealloc(Launcher *self)
{
    PyTypeObject *type = Py_TYPE((PyObject *)self);
    Py_XDECREF(self->loader);
    Py_XDECREF(self->on_error);
    Py_XDECREF(self->kernel);
    Py_XDECREF(self->arg_names);
    freefunc free_fn = (freefunc)PyType_GetSlot(type, Py_tp_free);
    free_fn(self);
    Py_DECREF(type);
}

/* ---- the launch ---- */

static int grid_overflow(void)
{
    PyErr_SetString(PyExc_OverflowError, "grid expression overflows 64 bits");
    return -1;
}

static int eval_grid(const Launcher *self, const slot *values, int64_t out[3])
{
    int64_t stack[MAX_STACK + 1];
    int sp = 0, dim = 0;
    for (Py_ssize_t i = 0; i < self->nsteps; i++) {
        const grid_step s = self->grid[i];
        int64_t a, b, r;
        switch (s.op) {
        case G_CONST:
            stack[sp++] = s.operand;
            continue;
        case G_ARG:
            stack[sp++] = values[s.operand].i;
            continue;
        case G_END:
            out[dim++] = stack[--sp];
            continue;
        }
        b = stack[--sp];
        a = stack[sp - 1];
        switch (s.op) {
        case G_ADD:
            if (__builtin_add_overflow(a, b, &r)) return grid_overflow();
            break;
        case G_SUB:
            if (__builtin_sub_overflow(a, b, &r)) return grid_overflow();
            break;
        case G_MUL:
            if (__builtin_mul_overflow(a, b, &r)) return grid_overflow();
            break;
        case G_FLOORDIV: /* Python's: rounds toward minus infinity */
        case G_MOD:
            if (b == 0) {
                PyErr_SetString(PyExc_ZeroDivisionError, "integer division or modulo by zero in a grid expression");
                return -1;
            }
            if (a == INT64_MIN && b == -1) {
                if (s.op == G_MOD) {
                    r = 0;
                    break;
                }
                return grid_overflow();
            }
            if (s.op == G_FLOORDIV) {
                r = a / b;
                if (a % b != 0 && ((a < 0) != (b < 0))) r--;
            } else {
                r = a % b;
                if (r != 0 && ((r < 0) != (b < 0))) r += b;
            }
            break;
        case G_MIN:
            r = a < b ? a : b;
            break;
        default: /* G_MAX */
            r = a > b ? a : b;
            break;
        }
        stack[sp - 1] = r;
    }
    return 0;
}

static int wrong_type(PyObject *v, Py_ssize_t index, const char *want)
{
    PyErr_Clear();
    PyObject *name = PyType_GetName(Py_TYPE(v));
    if (name != NULL) {
        PyErr_Format(PyExc_TypeError, "value %zd must be %s, got %U", index, want, name);
        Py_DECREF(name);
    }
    return -1;
}

/* Convert one value into its slot; -1 with an exception set if it does not fit its type. */
static int convert(PyObject *v, unsigned char type, slot *out, Py_ssize_t index)
{
    switch (type) {
    case V_PTR: {
        unsigned long long u = PyLong_AsUnsignedLongLong(v);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
            PyErr_Clear(); /* not an int: anything with __index__ will do, like struct's 'Q' */
            PyObject *as_int = PyNumber_Index(v);
            if (as_int == NULL) goto not_int;
            u = PyLong_AsUnsignedLongLong(as_int);
            Py_DECREF(as_int);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        }
        out->u = u;
        return 0;
    }
    case V_I64:
    case V_I32: {
        long long i = PyLong_AsLongLong(v);
        if (i == -1 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_TypeError)) goto not_int;
            return -1;
        }
        if (type == V_I32 && (i < INT32_MIN || i > INT32_MAX)) {
            PyErr_Format(PyExc_OverflowError, "value %zd (%lld) does not fit a 32-bit kernel parameter", index, i);
            return -1;
        }
        out->i = i; /* an i32's bytes are the low four of its int64: little-endian */
        return 0;
    }
    default: { /* V_F32 */
        double d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) {
            return PyErr_ExceptionMatches(PyExc_TypeError) ? wrong_type(v, index, "a float") : -1;
        }
        float f = (float)d;
        if (__builtin_isinf(f) && !__builtin_isinf(d)) {
            PyErr_Format(PyExc_OverflowError, "value %zd does not fit a 32-bit float kernel parameter", index);
            return -1;
        }
        out->u = 0;
        out->f = f;
        return 0;
    }
    }
not_int:
    return wrong_type(v, index, "an int");
}

static PyObject *load(Launcher *self, Py_ssize_t device)
{
    PyObject *index = PyLong_FromSsize_t(device);
    if (index == NULL) return NULL;
    PyObject *addresses = PyObject_CallFunctionObjArgs(self->loader, index, NULL);
    Py_DECREF(index);
    return addresses;
}

/* The launch without error handling: 0 and *result set, or -1 with an exception set. */
static int try_launch(Launcher *self, PyObject *const *args, Py_ssize_t nargs, int *result)
{
    if (nargs != self->nvalues + 2) {
        PyErr_Format(PyExc_TypeError, "launcher takes (device, stream, *values) with %zd values, got %zd values", self->nvalues,
                     nargs < 2 ? 0 : nargs - 2);
        return -1;
    }
    long device = PyLong_AsLong(args[0]);
    if (device == -1 && PyErr_Occurred()) return -1;
    if (device < 0 || device >= MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "device index %ld is outside 0..%d", device, MAX_DEVICES - 1);
        return -1;
    }
    unsigned long long stream = PyLong_AsUnsignedLongLong(args[1]);
    if (stream == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    slot values[MAX_VALUES];
    for (Py_ssize_t i = 0; i < self->nvalues; i++)
        if (convert(args[i + 2], self->types[i], &values[i], i) < 0) return -1;
    if (self->nconstants) memcpy(&values[self->nvalues], self->constants, self->nconstants * sizeof(slot));
    int64_t grid[3];
    if (eval_grid(self, values, grid) < 0) return -1;
    *result = 0;
    if (grid[0] <= 0 || grid[1] <= 0 || grid[2] <= 0) return 0; /* nothing to do (empty batch) */
    if (grid[0] > UINT32_MAX || grid[1] > UINT32_MAX || grid[2] > UINT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "grid (%lld, %lld, %lld) exceeds 32 bits", (long long)grid[0], (long long)grid[1],
                     (long long)grid[2]);
        return -1;
    }
    void *fn = self->functions[device];
    if (fn == NULL || self->launch == NULL) {
        PyObject *addresses = load(self, device);
        if (addresses == NULL) return -1;
        unsigned long long launch_address = 0, fn_address = 0;
        int ok = PyArg_ParseTuple(addresses, "KK", &launch_address, &fn_address);
        Py_DECREF(addresses);
        if (!ok) return -1;
        if (launch_address == 0 || fn_address == 0) {
            PyErr_SetString(PyExc_ValueError, "loader returned a null address");
            return -1;
        }
        self->launch = (void *)(uintptr_t)launch_address;
        self->functions[device] = fn = (void *)(uintptr_t)fn_address;
    }
    void *params[MAX_VALUES];
    for (Py_ssize_t i = 0; i < self->nparams; i++) params[i] = &values[self->param_value[i]];
    int r;
    if (self->pdl) {
        launch_attribute attr;
        memset(&attr, 0, sizeof attr);
        attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmatic_stream_serialization_allowed = 1;
        launch_config config = {{(unsigned int)grid[0], (unsigned int)grid[1], (unsigned int)grid[2]},
                                {self->block[0], self->block[1], self->block[2]},
                                self->smem,
                                (uintptr_t)stream,
                                &attr,
                                1};
        launch_ex_fn launch_ex = (launch_ex_fn)self->launch;
        Py_BEGIN_ALLOW_THREADS
        r = launch_ex(&config, fn, params, NULL);
        Py_END_ALLOW_THREADS
    } else {
        launch_fn launch = (launch_fn)self->launch;
        Py_BEGIN_ALLOW_THREADS
        r = launch(fn, (unsigned int)grid[0], (unsigned int)grid[1], (unsigned int)grid[2], self->block[0], self->block[1],
                   self->block[2], self->smem, (uintptr_t)stream, params, NULL);
        Py_END_ALLOW_THREADS
    }
    *result = r;
    return 0;
}

static PyObject *failed(Launcher *self, int result, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *call = PyTuple_New(nargs + 2);
    if (call == NULL) return NULL;
    Py_INCREF((PyObject *)self);
    PyTuple_SetItem(call, 0, (PyObject *)self);
    PyObject *code = PyLong_FromLong(result);
    if (code == NULL) {
        Py_DECREF(call);
        return NULL;
    }
    PyTuple_SetItem(call, 1, code);
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SetItem(call, i + 2, args[i]);
    }
    PyObject *out = PyObject_Call(self->on_error, call, NULL);
    Py_DECREF(call);
    return out;
}

static PyObject *launcher_launch(Launcher *self, PyObject *const *args, Py_ssize_t nargs)
{
    int result;
    if (try_launch(self, args, nargs, &result) < 0) return NULL;
    if (result != 0) return failed(self, result, args, nargs);
    Py_RETURN_NONE;
}

static PyObject *launcher_try_launch(Launcher *self, PyObject *const *args, Py_ssize_t nargs)
{
    int result;
    if (try_launch(self, args, nargs, &result) < 0) return NULL;
    return PyLong_FromLong(result);
}

static PyObject *launcher_call(Launcher *self, PyObject *args, PyObject *kwargs)
{
    if (kwargs != NULL && PyDict_Size(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "launcher takes no keyword arguments");
        return NULL;
    }
    PyObject *items[MAX_VALUES + 2];
    Py_ssize_t n = PyTuple_Size(args);
    if (n < 0) return NULL;
    if (n > MAX_VALUES + 2) {
        PyErr_Format(PyExc_TypeError, "launcher takes %zd values, got %zd arguments", self->nvalues, n);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) items[i] = PyTuple_GetItem(args, i); /* borrowed */
    return launcher_launch(self, items, n);
}

static PyObject *launcher_loaded(Launcher *self, PyObject *unused)
{
    (void)unused;
    PyObject *out = PyList_New(0);
    for (Py_ssize_t d = 0; out != NULL && d < MAX_DEVICES; d++) {
        if (self->functions[d] == NULL) continue;
        PyObject *index = PyLong_FromSsize_t(d);
        if (index == NULL || PyList_Append(out, index) < 0) Py_CLEAR(out);
        Py_XDECREF(index);
    }
    return out;
}

static PyObject *launcher_repr(Launcher *self)
{
    return PyUnicode_FromFormat("<compiled launcher of %R>", self->kernel);
}

static PyObject *get_kernel(Launcher *self, void *closure)
{
    (void)closure;
    Py_INCREF(self->kernel);
    return self->kernel;
}

static PyObject *get_pdl(Launcher *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->pdl);
}

static PyObject *get_arg_names(Launcher *self, void *closure)
{
    (void)closure;
    Py_INCREF(self->arg_names);
    return self->arg_names;
}

static PyMethodDef launcher_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launcher_launch, METH_FASTCALL,
     "launch(device, stream, *values): launch; a driver error goes to on_error"},
    {"try_launch", (PyCFunction)(void (*)(void))launcher_try_launch, METH_FASTCALL,
     "try_launch(device, stream, *values) -> CUresult, without error handling"},
    {"loaded", (PyCFunction)launcher_loaded, METH_NOARGS, "device indices whose CUfunction this launcher holds"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef launcher_getset[] = {
    {"kernel", (getter)get_kernel, NULL, "the Kernel this launches", NULL},
    {"arg_names", (getter)get_arg_names, NULL, "the op's argument order", NULL},
    {"pdl", (getter)get_pdl, NULL, "whether launches go through cuLaunchKernelEx with programmatic dependent launch", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot launcher_slots[] = {
    {Py_tp_new, launcher_new},
    {Py_tp_dealloc, launcher_dealloc},
    {Py_tp_call, launcher_call},
    {Py_tp_repr, launcher_repr},
    {Py_tp_methods, launcher_methods},
    {Py_tp_getset, launcher_getset},
    {Py_tp_doc, "Launcher(fmt, params, grid, (bx, by, bz), smem, loader, on_error, kernel=None, arg_names=None, pdl=False, "
                "constants=b'')\n\n"
                "fmt: one struct code per value (Q ptr, q i64, i i32, f f32); params: bytes, the value index of each "
                "kernel parameter (past the values: a constant); grid: the postfix program of tkaot._spec.grid_program; "
                "constants: values fixed for every call, eight little-endian bytes each."},
    {0, NULL},
};

static PyType_Spec launcher_spec = {
    "tkaot._launch.Launcher",
    sizeof(Launcher),
    0,
    Py_TPFLAGS_DEFAULT,
    launcher_slots,
};

static int exec_module(PyObject *module)
{
    PyObject *type = PyType_FromSpec(&launcher_spec);
    if (type == NULL) return -1;
    if (PyModule_AddObject(module, "Launcher", type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    if (PyModule_AddIntConstant(module, "MAX_DEVICES", MAX_DEVICES) < 0) return -1;
    if (PyModule_AddIntConstant(module, "MAX_VALUES", MAX_VALUES) < 0) return -1;
    if (PyModule_AddIntConstant(module, "MAX_CONSTANTS", MAX_CONSTANTS) < 0) return -1;
    PyObject *noop = PyLong_FromVoidPtr((void *)(uintptr_t)noop_launch);
    if (noop == NULL || PyModule_AddObject(module, "NOOP_LAUNCH", noop) < 0) {
        Py_XDECREF(noop);
        return -1;
    }
    PyObject *noop_ex = PyLong_FromVoidPtr((void *)(uintptr_t)noop_launch_ex);
    if (noop_ex == NULL || PyModule_AddObject(module, "NOOP_LAUNCH_EX", noop_ex) < 0) {
        Py_XDECREF(noop_ex);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "tkaot._launch",
    "The compiled launch path (see tkaot/_kernel.py); NOOP_LAUNCH and NOOP_LAUNCH_EX are cuLaunchKernel and cuLaunchKernelEx "
    "stand-ins for benchmarks and tests.",
    0,
    NULL,
    module_slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__launch(void)
{
    return PyModuleDef_Init(&module_def);
}
