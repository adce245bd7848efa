/* Every PY_VERSION_HEX shim of heapwatch._core lives here.
 *
 * Frame walking reads the interpreter's own frame structures (as CPython's
 * Python/tracemalloc.c does): the public PyFrame API would create frame
 * objects, i.e. allocate, from inside an allocator hook.  On 3.11+ that means
 * the internal header pycore_frame.h, which we include with Py_BUILD_CORE.
 */
#ifndef HEAPWATCH_COMPAT_H
#define HEAPWATCH_COMPAT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sched.h>

#if PY_VERSION_HEX < 0x03090000 || PY_VERSION_HEX >= 0x03100000
#  error "heapwatch._core supports CPython 3.9 to 3.15"
#endif
#ifdef Py_GIL_DISABLED
#  error "heapwatch._core does not support free-threaded CPython builds"
#endif

#if PY_VERSION_HEX >= 0x030B0000
#  ifndef Py_BUILD_CORE
#    define Py_BUILD_CORE 1
#    define HW_UNDEF_BUILD_CORE 1
#  endif
#  pragma GCC diagnostic push
#  pragma GCC diagnostic ignored "-Wunused-parameter"
#  pragma GCC diagnostic ignored "-Wsign-compare"
#  pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#  include "internal/pycore_frame.h"
#  if PY_VERSION_HEX >= 0x030E0000
/* 3.14 moved the frame's inline helpers and the stack references out of
 * pycore_frame.h. */
#    include "internal/pycore_interpframe.h"
#    include "internal/pycore_stackref.h"
#  endif
#  if PY_VERSION_HEX >= 0x030D0000
/* _PyRuntime.allocators: see hw_domain_allocator(). */
#    include "internal/pycore_runtime.h"
#  endif
#  pragma GCC diagnostic pop
#  ifdef HW_UNDEF_BUILD_CORE
#    undef Py_BUILD_CORE
#    undef HW_UNDEF_BUILD_CORE
#  endif
typedef _PyInterpreterFrame hw_pyframe_t;
#else
#  include <frameobject.h>
typedef PyFrameObject hw_pyframe_t;
#endif

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *
Py_NewRef(PyObject *obj)
{
    Py_INCREF(obj);
    return obj;
}
#endif

/* The interpreter's reference tracer (PyRefTracer_SetTracer), which
 * reftracer.c uses and the hooks feed (hw_tls_t.stamped), exists from 3.13. */
#if PY_VERSION_HEX >= 0x030D0000
#  define HW_HAVE_REFTRACER 1
#else
#  define HW_HAVE_REFTRACER 0
#endif

/* Paths the hooks rarely take stay out of line, so that the hot paths
 * (flattened: see hooks.c) keep their registers and their code small. */
#define HW_COLD __attribute__((noinline, cold))
#if PY_VERSION_HEX >= 0x030D0000
/* Exported, declared in an internal header since 3.13. */
PyAPI_FUNC(const char *) _PyMem_GetCurrentAllocatorName(void);
#endif

/* The allocator a domain's PyMem_* functions call, where it can be reached
 * (3.13+: in _PyRuntime; 3.12's header cannot be included here, and before,
 * it is a static of obmalloc.c), else NULL; with hw_allocators_lock() and
 * unlock(), PyMem_SetAllocator's own lock around it. */
#if PY_VERSION_HEX >= 0x030D0000
static inline PyMemAllocatorEx *
hw_domain_allocator(PyMemAllocatorDomain domain)
{
    switch (domain) {
    case PYMEM_DOMAIN_RAW:
        return &_PyRuntime.allocators.standard.raw;
    case PYMEM_DOMAIN_MEM:
        return &_PyRuntime.allocators.standard.mem;
    case PYMEM_DOMAIN_OBJ:
        return &_PyRuntime.allocators.standard.obj;
    }
    return NULL;
}

/* Spins rather than calling PyMutex_Lock, which would drop the GIL while it
 * waits (PyMem_SetAllocator keeps it, through a function 3.13 does not
 * export); only another allocator swap holds this lock, for a moment. */
static inline void
hw_allocators_lock(void)
{
    uint8_t *bits = &_PyRuntime.allocators.mutex._bits;
    for (;;) {
        uint8_t seen = __atomic_load_n(bits, __ATOMIC_RELAXED);
        if (!(seen & _Py_LOCKED) &&
            __atomic_compare_exchange_n(bits, &seen, (uint8_t)(seen | _Py_LOCKED), 0,
                                        __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
            return;
        }
        sched_yield();
    }
}

static inline void
hw_allocators_unlock(void)
{
    PyMutex_Unlock(&_PyRuntime.allocators.mutex);
}
#else
static inline PyMemAllocatorEx *
hw_domain_allocator(PyMemAllocatorDomain domain)
{
    (void)domain;
    return NULL;
}

static inline void
hw_allocators_lock(void)
{
}

static inline void
hw_allocators_unlock(void)
{
}
#endif

#define HW_LIKELY(x) __builtin_expect(!!(x), 1)
#define HW_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* The thread state attached to the calling thread, or the GIL holder's on
 * 3.9-3.11 where the "current" thread state is a process global.  Callers
 * compare it with PyGILState_GetThisThreadState() when that matters. */
static inline PyThreadState *
hw_tstate_unchecked(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyThreadState_GetUnchecked();
#else
    return _PyThreadState_UncheckedGet();
#endif
}

/* The calling thread's thread state if it holds the GIL, else NULL.  Never
 * trusts PyGILState_Check(), which answers 1 when the check is disabled
 * (sub-interpreters) and would let us read another thread's frames. */
static inline PyThreadState *
hw_tstate_if_gil_held(void)
{
    PyThreadState *mine = PyGILState_GetThisThreadState();
    if (mine == NULL) {
        return NULL;
    }
    return hw_tstate_unchecked() == mine ? mine : NULL;
}

/* Innermost frame of a thread.  Only the owning thread writes these fields,
 * so the owning thread may read them without the GIL. */
static inline hw_pyframe_t *
hw_frame_top(PyThreadState *tstate)
{
#if PY_VERSION_HEX >= 0x030D0000
    return tstate->current_frame;
#elif PY_VERSION_HEX >= 0x030B0000
    return tstate->cframe != NULL ? tstate->cframe->current_frame : NULL;
#else
    return tstate->frame;
#endif
}

static inline hw_pyframe_t *
hw_frame_back(hw_pyframe_t *frame)
{
#if PY_VERSION_HEX >= 0x030B0000
    return frame->previous;
#else
    return frame->f_back;
#endif
}

/* Where hw_frame_back() reads, for code that reads it in assembly. */
#if PY_VERSION_HEX >= 0x030B0000
#  define HW_FRAME_BACK_OFFSET offsetof(hw_pyframe_t, previous)
#else
#  define HW_FRAME_BACK_OFFSET offsetof(hw_pyframe_t, f_back)
#endif

/* The word naming what a frame runs (3.12+: its code object, tagged on
 * 3.14+; None for the interpreter's entry frames), read as bits: where the
 * capture memo's assembly reads it, and as it does. */
#if PY_VERSION_HEX >= 0x030D0000
#  define HW_FRAME_EXECUTABLE_OFFSET offsetof(hw_pyframe_t, f_executable)
#elif PY_VERSION_HEX >= 0x030C0000
#  define HW_FRAME_EXECUTABLE_OFFSET offsetof(hw_pyframe_t, f_code)
#endif
#ifdef HW_FRAME_EXECUTABLE_OFFSET
static inline uintptr_t
hw_frame_executable_bits(const hw_pyframe_t *frame)
{
    uintptr_t bits;
    memcpy(&bits, (const char *)frame + HW_FRAME_EXECUTABLE_OFFSET, sizeof(bits));
    return bits;
}
#endif

#if PY_VERSION_HEX >= 0x030E0000
/* From 3.14 the executable is a tagged stack reference: the low bits
 * (Py_TAG_BITS, one on 3.14, two on 3.15) say how it is owned, not where. */
static inline PyObject *
hw_frame_executable(hw_pyframe_t *frame)
{
    return PyStackRef_AsPyObjectBorrow(frame->f_executable);
}

/* Frames the interpreter owns (3.14: the C-stack shims too; 3.15 dropped
 * FRAME_OWNED_BY_CSTACK) are never complete, as _PyFrame_IsIncomplete says. */
#  define HW_FRAME_IS_SHIM(frame) ((frame)->owner >= FRAME_OWNED_BY_INTERPRETER)
#elif PY_VERSION_HEX >= 0x030D0000
static inline PyObject *
hw_frame_executable(hw_pyframe_t *frame)
{
    return frame->f_executable;
}

#  define HW_FRAME_IS_SHIM(frame) ((frame)->owner == FRAME_OWNED_BY_CSTACK)
#elif PY_VERSION_HEX >= 0x030C0000
#  define HW_FRAME_IS_SHIM(frame) ((frame)->owner == FRAME_OWNED_BY_CSTACK)
#endif

/* The frame's code object, or NULL for frames the stdlib tracer skips
 * (incomplete frames being set up, and C-stack shim frames). */
static inline PyCodeObject *
hw_frame_code_if_complete(hw_pyframe_t *frame)
{
#if PY_VERSION_HEX >= 0x030D0000
    if (HW_FRAME_IS_SHIM(frame) || !PyCode_Check(hw_frame_executable(frame))) {
        return NULL;
    }
    return _PyFrame_IsIncomplete(frame) ? NULL : (PyCodeObject *)hw_frame_executable(frame);
#elif PY_VERSION_HEX >= 0x030C0000
    if (HW_FRAME_IS_SHIM(frame)) {
        return NULL;
    }
    return _PyFrame_IsIncomplete(frame) ? NULL : frame->f_code;
#elif PY_VERSION_HEX >= 0x030B0000
    return _PyFrame_IsIncomplete(frame) ? NULL : frame->f_code;
#else
    return frame->f_code;
#endif
}

/* Whether a frame below the innermost complete one counts in total_nframe,
 * as in the stdlib, which skips every incomplete frame: the C-stack shims,
 * and from 3.13 the trampoline the interpreter pushes under a class's
 * __init__ (_Py_InitCleanup, a frame of the thread's, which never reaches
 * its first traceable instruction).  Every other frame below the innermost
 * has called into the one above it, so it is complete: the test is cheap,
 * on the hot walk to the bottom of deep stacks. */
#if PY_VERSION_HEX >= 0x030E0000
/* The trampoline's code object is exported from 3.14 (pycore_code.h):
 * compared by address, beside the link, with no read of the code object (a
 * cache miss a frame on a deep stack).  A frame the interpreter does not own
 * runs a code object (_PyFrame_GetCode asserts it). */
static inline int
hw_frame_counts_below(hw_pyframe_t *frame)
{
    return !HW_FRAME_IS_SHIM(frame) &&
           hw_frame_executable(frame) != (const PyObject *)&_Py_InitCleanup;
}
#elif PY_VERSION_HEX >= 0x030D0000
/* 3.13 exports no trampoline, but runs it with None for a function (every
 * other frame of the thread's has its function): read beside the link. */
static inline int
hw_frame_counts_below(hw_pyframe_t *frame)
{
    return !HW_FRAME_IS_SHIM(frame) && frame->f_funcobj != Py_None &&
           PyCode_Check(hw_frame_executable(frame));
}
#elif PY_VERSION_HEX >= 0x030C0000
/* 3.12's trampoline is a C-stack shim by its owner. */
static inline int
hw_frame_counts_below(hw_pyframe_t *frame)
{
    return !HW_FRAME_IS_SHIM(frame);
}
#else
static inline int
hw_frame_counts_below(hw_pyframe_t *frame)
{
    (void)frame;
    return 1;
}
#endif

/* Whether hw_frame_counts_below() is 1 for every frame. */
#if PY_VERSION_HEX >= 0x030C0000
#  define HW_EVERY_FRAME_COUNTS 0
#else
#  define HW_EVERY_FRAME_COUNTS 1
#endif

/* The code object of a frame hw_frame_counts_below() accepts. */
static inline PyCodeObject *
hw_frame_code(hw_pyframe_t *frame)
{
#if PY_VERSION_HEX >= 0x030D0000
    return (PyCodeObject *)hw_frame_executable(frame);
#else
    return frame->f_code;
#endif
}

/* Byte offset of the frame's current instruction, the unit
 * PyCode_Addr2Line() takes.  Negative before the first instruction. */
static inline int
hw_frame_lasti(hw_pyframe_t *frame, PyCodeObject *code)
{
#if PY_VERSION_HEX >= 0x030D0000
    return (int)(frame->instr_ptr - _PyCode_CODE(code)) * (int)sizeof(_Py_CODEUNIT);
#elif PY_VERSION_HEX >= 0x030B0000
    return (int)(frame->prev_instr - _PyCode_CODE(code)) * (int)sizeof(_Py_CODEUNIT);
#elif PY_VERSION_HEX >= 0x030A0000
    (void)code;
    return frame->f_lasti * (int)sizeof(_Py_CODEUNIT);
#else
    (void)code;
    return frame->f_lasti;
#endif
}

/* Start of the memory block holding obj: GC objects and, on 3.11+, objects
 * with a managed dict or weakref list have a pre-header before the PyObject. */
static inline void *
hw_object_block(PyObject *obj)
{
    PyTypeObject *type = Py_TYPE(obj);
    size_t pre = 0;
    if (PyType_IS_GC(type)) {
        pre += 2 * sizeof(uintptr_t); /* PyGC_Head on 3.9-3.13 */
    }
#if PY_VERSION_HEX >= 0x030C0000
    if (PyType_HasFeature(type, Py_TPFLAGS_PREHEADER)) {
        pre += 2 * sizeof(PyObject *);
    }
#elif PY_VERSION_HEX >= 0x030B0000
    if (PyType_HasFeature(type, Py_TPFLAGS_MANAGED_DICT)) {
        pre += 2 * sizeof(PyObject *);
    }
#endif
    return (char *)obj - pre;
}

static inline int
hw_py_is_finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

#endif /* HEAPWATCH_COMPAT_H */
