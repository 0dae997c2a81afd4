"""Programmatic dependent launch (PDL), the kernel side.

A kernel launched with the programmatic-stream-serialization attribute may start
before the kernel ahead of it in the stream has finished: its blocks are
scheduled as that kernel's blocks leave the SMs, so the launch latency and the
block ramp overlap the previous kernel's tail. Such a kernel must wait, before
it touches global memory, until every grid it depends on has completed and
its writes are visible (griddepcontrol.wait); until it does, it may only compute
from its parameters. `pdl_entry` is that wait, followed by the signal that lets
the kernel behind it launch early in turn (griddepcontrol.launch_dependents:
its own blocks are all resident or done by the time that takes effect, so they
are never starved of SMs). A kernel without the PDL attribute on its launch
runs both instructions as no-ops.

The runtime launches a variant with the attribute only when its manifest entry
says `pdl` (tkaot/_kernel.py); a variant built without `pdl_entry` must never
be launched with it, as it would read its inputs before they are written.
"""

import tilelang.language as T


def asm_function(name: str, instruction: str) -> str:
    """CUDA source of `int name()`, one PTX instruction with a memory clobber (no access moves across it), returning 0
    as T.call_extern's int-returning calls expect."""
    return f'__device__ __forceinline__ int {name}() {{\n    asm volatile("{instruction};" ::: "memory");\n    return 0;\n}}\n'


PDL_SOURCE = (
    "\n"
    + asm_function("tkaot_pdl_wait", "griddepcontrol.wait")
    + asm_function("tkaot_pdl_launch_dependents", "griddepcontrol.launch_dependents")
)


@T.macro
def pdl_entry():
    T.call_extern("int32", "tkaot_pdl_wait")
    T.call_extern("int32", "tkaot_pdl_launch_dependents")


@T.macro
def kernel_entry(extra_source: str = ""):
    """A kernel's first statements: PDL_SOURCE (and the kernel's own `extra_source` helpers) imported, then pdl_entry,
    before any memory access. (It takes no sizes to assume positive: a macro parameter bound to a runtime size renames
    it in the kernel's signature.)"""
    T.import_source(PDL_SOURCE + extra_source)
    pdl_entry()
