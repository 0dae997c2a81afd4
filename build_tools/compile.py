"""Compile one Variant: lower with TileLang, check it against its declaration, nvcc to a cubin, read its LaunchSpec.

Runs on a CPU-only machine: the target is explicit and lowering happens
inside its context. The lowered kernel's op-facing arguments and dynamic dims
must be those its declaration (tkaot/_<family>/kernels.py) names, or the build
stops. The LaunchSpec is read from the lowered device module, so the parameter
order is the generated kernel's own.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from build_tools import nvcc_batch
from build_tools.ops import Variant, build_static, declaration, fixed_values, load_kernel_module, runtime_axes, source_sha256
from tkaot._decl import KernelDecl
from tkaot._spec import Arg, LaunchSpec, Param

ARCHES = {
    # arch name -> (TileLang target arch, nvcc gencode)
    "sm90": ("sm_90", "arch=compute_90a,code=sm_90a"),
    "sm100": ("sm_100", "arch=compute_100a,code=sm_100a"),  # Blackwell: built here, not run on hardware yet
}
NVCC_FLAGS = ("--cubin", "-O3", "-std=c++20", "-w")
# nvcc names internal-linkage symbols (e.g. those of CUDA's std headers, `_INTERNAL_<hash>_9_kernel_cu_...`) after a
# hash of the source's absolute path, a temporary directory here: naming the source by its file name alone gives a
# cold build the same bytes. Not in cache_key: it changes no cubin without such symbols, and the one kernel that
# has them (engram_gate_fwd) was rebuilt with it.
SOURCE_NAME_FLAGS = ("-Xcicc", "--orig_src_path_name=kernel.cu", "-Xcicc", "--orig_src_file_name=kernel.cu")

_SCALAR_TYPES = {"int32": "i32", "int64": "i64", "float32": "f32"}


class BuildError(RuntimeError):
    """A variant cannot be built; the message says which and why."""


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise BuildError("nvcc is not on PATH; install the CUDA toolkit (13.0) to build cubins")
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"V(\d+\.\d+\.\d+)", out)
    return match.group(1) if match else out.strip().splitlines()[-1]


@functools.lru_cache(maxsize=1)
def tilelang_version() -> str:
    from importlib.metadata import version

    return version("tilelang")


def nvcc_flags(arch: str) -> list[str]:
    """The flags every cubin of `arch` is compiled with (also the manifest's provenance)."""
    return [*NVCC_FLAGS, *SOURCE_NAME_FLAGS, "-gencode", ARCHES[arch][1]]


def nvcc_command(arch: str) -> list[str]:
    from tilelang import env

    return ["nvcc", *nvcc_flags(arch), "-I" + env.TILELANG_TEMPLATE_PATH, "-I" + env.CUTLASS_INCLUDE_DIR]


# Raised when launch_spec reads more from a compiled kernel, so cached entries from before are rebuilt
# (2: the "pdl" flag)
LAUNCH_SPEC_VERSION = 2


def kernel_runtime_axes(kernel: str) -> tuple[str, ...]:
    """The static axes of the kernel's declaration that its CUDA module takes at run time (RUNTIME_AXES)."""
    return runtime_axes(load_kernel_module(kernel))


def cache_key(variant: Variant, arch: str, source: str | None = None) -> str:
    """Everything that decides the cubin's bytes, hashed: the kernel's declaration and sources (ops.source_sha256),
    its static values but those its module takes at run time (variants differing only in those share the key, so
    one lowering and one cubin), the arch, TileLang and nvcc versions and flags."""
    runtime = kernel_runtime_axes(variant.kernel)
    inputs = {
        "kernel": variant.kernel,
        "static": [[k, v] for k, v in build_static(variant, runtime).items()],
        "source": source or source_sha256(variant.kernel),  # callers hashing many variants pass it once
        "arch": arch,
        "tilelang": tilelang_version(),
        "nvcc": nvcc_version(),
        "flags": list(NVCC_FLAGS) + [ARCHES[arch][1]],
        "launch_spec": LAUNCH_SPEC_VERSION,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class CompiledVariant:
    variant: Variant
    arch: str
    spec: LaunchSpec
    cubin: bytes
    cache_key: str
    source_sha256: str
    fixed: dict = dataclasses.field(default_factory=dict)  # the values of the axes the kernel takes at run time

    def serving(self, variant: Variant) -> CompiledVariant:
        """This compiled kernel as it serves `variant`, which shares its cache key: with the variant's own fixed values."""
        return dataclasses.replace(self, variant=variant, fixed=fixed_values(variant, kernel_runtime_axes(variant.kernel)))


def lower(variant: Variant, arch: str):
    """Lower the variant's PrimFunc; returns (prim_func, device PrimFunc, CUDA source)."""
    import tilelang
    from tilelang import tvm

    module = load_kernel_module(variant.kernel)
    if getattr(module, "DECL", None) is not declaration(variant.kernel):
        raise BuildError(f"{module.__name__} does not build kernel {variant.kernel!r}: its DECL is not that declaration")
    target = tvm.target.Target({"kind": "cuda", "arch": ARCHES[arch][0]})
    # A kernel module's PASS_CONFIGS (TileLang pass options, e.g. its own barriers instead of the inserted ones) apply
    # to its lowering alone, at the ambient optimisation level
    configs = getattr(module, "PASS_CONFIGS", None)
    level = tvm.transform.PassContext.current().opt_level
    passes = tvm.transform.PassContext(opt_level=level, config=dict(configs)) if configs else nullcontext()
    with target, passes:
        prim_func = module.build(**build_static(variant, runtime_axes(module)))
        artifact = tilelang.lower(prim_func, target=target)
    device_funcs = list(artifact.device_mod.functions.items())
    if len(device_funcs) != 1:
        raise BuildError(f"{variant.kernel} [{variant.key}]: expected one device kernel, TileLang made {len(device_funcs)}")
    return prim_func, device_funcs[0], artifact.kernel_source


def expr_text(expr, names: set[str]) -> str:
    """Render a TIR integer expression as text in the manifest grid grammar."""
    from tilelang import tvm

    tirx = tvm.tirx
    binops = {tirx.Add: "+", tirx.Sub: "-", tirx.Mul: "*", tirx.FloorDiv: "//", tirx.FloorMod: "%"}
    for node_type, op in binops.items():
        if isinstance(expr, node_type):
            return f"({expr_text(expr.a, names)} {op} {expr_text(expr.b, names)})"
    # Truncating division equals floor division on the non-negative dims here
    if isinstance(expr, tirx.Div):
        return f"({expr_text(expr.a, names)} // {expr_text(expr.b, names)})"
    if isinstance(expr, tirx.Mod):
        return f"({expr_text(expr.a, names)} % {expr_text(expr.b, names)})"
    if isinstance(expr, (tirx.Min, tirx.Max)):
        fn = "min" if isinstance(expr, tirx.Min) else "max"
        return f"{fn}({expr_text(expr.a, names)}, {expr_text(expr.b, names)})"
    if isinstance(expr, tirx.IntImm):
        return str(int(expr.value))
    if isinstance(expr, tirx.Cast):
        return expr_text(expr.value, names)
    if isinstance(expr, tirx.Var) and expr.name in names:
        return expr.name
    raise BuildError(f"grid expression {expr} uses {type(expr).__name__}, which the runtime cannot evaluate")


def op_args(prim_func) -> tuple[Arg, ...]:
    """The op-facing arguments: PrimFunc params in order, then dynamic dims in first-seen order."""
    from tilelang import tvm

    tirx = tvm.tirx
    args: list[Arg] = []
    dims: dict[str, None] = {}
    for param in prim_func.params:
        buffer = prim_func.buffer_map.get(param)
        if buffer is None:
            if param.dtype not in _SCALAR_TYPES:
                raise BuildError(f"scalar parameter {param.name} has unsupported type {param.dtype}")
            args.append(Arg(param.name, "scalar", _SCALAR_TYPES[param.dtype]))
            continue
        args.append(Arg(buffer.name, "tensor", "ptr"))
        for dim in list(buffer.shape) + list(buffer.strides):
            for var in tirx.analysis.undefined_vars(dim) if not isinstance(dim, tirx.IntImm) else []:
                dims.setdefault(var.name)
    names = {a.name for a in args}
    for name in dims:
        if name not in names:
            args.append(Arg(name, "dim", "i32"))
    return tuple(args)


def check_declared(args: tuple[Arg, ...], decl: KernelDecl, where: str, runtime: tuple[str, ...] = ()) -> None:
    """The lowered kernel's op-facing arguments and dynamic dims must be the declaration's (as sets), plus the static
    axes its module takes at run time (`runtime`, its RUNTIME_AXES) as dims."""
    problems = []
    for what, have, want in (
        ("arguments", {a.name for a in args}, {*decl.args, *runtime}),
        ("dynamic dims", {a.name for a in args if a.role == "dim"}, {*decl.dims, *runtime}),
    ):
        if have != want:
            extra, missing = sorted(have - want), sorted(want - have)
            found = ([f"undeclared {extra}"] if extra else []) + ([f"declared but absent {missing}"] if missing else [])
            problems.append(f"{what} {', '.join(found)}")
    if problems:
        raise BuildError(f"{where}: the lowered kernel does not match its declaration ({decl.name}): " + "; ".join(problems))


def launch_spec(variant: Variant, prim_func, device_func, kernel_source: str, decl: KernelDecl | None = None) -> LaunchSpec:
    gvar, func = device_func
    where = f"{variant.kernel} [{variant.key}]"
    if "__grid_constant__" in kernel_source or "CUtensorMap" in kernel_source:
        raise BuildError(f"{where}: the kernel takes a host-encoded TMA descriptor, which the runtime cannot fill yet")
    args = op_args(prim_func)
    check_declared(args, decl or declaration(variant.kernel), where, kernel_runtime_axes(variant.kernel))
    by_name = {a.name: a for a in args}
    params = []
    for p in func.params:
        ptype = "ptr" if p.dtype == "handle" else _SCALAR_TYPES.get(str(p.dtype))
        if ptype is None or p.name not in by_name or by_name[p.name].type != ptype:
            raise BuildError(
                f"{where}: generated kernel parameter {p.name} ({p.dtype}) maps to no op argument "
                "(a hidden scratch buffer or an unsupported type); the runtime cannot fill it"
            )
        params.append(Param(p.name, ptype))
    extents = {str(k): v for k, v in func.attrs["thread_extent"].items()}
    dims = {a.name for a in args if a.role == "dim"}
    grid = tuple(expr_text(extents[t], dims) if t in extents else "1" for t in ("blockIdx.x", "blockIdx.y", "blockIdx.z"))
    block = []
    for t in ("threadIdx.x", "threadIdx.y", "threadIdx.z"):
        extent = extents.get(t, 1)
        if not isinstance(extent, int) and not hasattr(extent, "value"):
            raise BuildError(f"{where}: block dimension {t} = {extent} is not a constant")
        block.append(int(extent if isinstance(extent, int) else extent.value))
    smem = func.attrs.get("dyn_shared_memory_buf", 0) if func.attrs is not None else 0
    if not isinstance(smem, int) and not hasattr(smem, "value"):
        raise BuildError(f"{where}: dynamic shared memory {smem} depends on runtime values")
    spec = LaunchSpec(
        symbol=str(func.attrs.get("global_symbol", gvar.name_hint)),
        params=tuple(params),
        args=args,
        grid=grid,
        block=tuple(block),
        smem=int(smem if isinstance(smem, int) else smem.value),
        pdl=waits_at_entry(kernel_source, [p.name for p in func.params if p.dtype == "handle"], where),
    )
    spec.check()
    return spec


def waits_at_entry(kernel_source: str, pointers: list[str], where: str) -> bool:
    """Whether the kernel runs kernels_src/pdl.py's pdl_entry (griddepcontrol.wait) before it names any of
    its pointer parameters, so it may be launched with programmatic dependent launch; a kernel that
    waits later is refused (it would read or write memory the kernel before it still owns)."""
    if "griddepcontrol.wait" not in kernel_source:
        return False
    body = kernel_source[kernel_source.rfind("__global__") :]
    body = body[body.find("{") + 1 :]
    before = body.split("tkaot_pdl_wait();", 1)[0]
    named = [p for p in pointers if re.search(rf"\b{re.escape(p)}\b", before)]
    if "tkaot_pdl_wait();" not in body or named:
        raise BuildError(f"{where}: the kernel waits for the grids before it (PDL), but not before it touches {named or 'memory'}")
    return True


def _nvcc(args: list[str], arch: str, cwd: str, where: str) -> None:
    proc = subprocess.run([*nvcc_command(arch), *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{where}: nvcc failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def nvcc_compile(source: str, arch: str, where: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="tkaot-nvcc-") as tmp:
        # The same file names in every build keep the cubin reproducible.
        Path(tmp, "kernel.cu").write_text(source)
        _nvcc(["kernel.cu", "-o", "kernel.cubin"], arch, tmp, where)
        return Path(tmp, "kernel.cubin").read_bytes()


def nvcc_compile_batch(sources: list[str], arch: str, wheres: list[str]) -> list[bytes] | None:
    """The cubins of sources that share their preamble, through one front-end pass (build_tools/nvcc_batch.py): the
    same bytes as nvcc_compile of each. None when the batch's PTX holds what the cut does not take."""
    with tempfile.TemporaryDirectory(prefix="tkaot-nvcc-") as tmp:
        Path(tmp, "kernel.cu").write_text(nvcc_batch.batch_source(sources))
        ptx_flags = ["--ptx" if f == "--cubin" else f for f in nvcc_command(arch)]
        proc = subprocess.run([*ptx_flags, "kernel.cu", "-o", "kernel.ptx"], cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0:
            return None  # compiled one by one, so that the error names its variant
        modules = nvcc_batch.split_ptx(Path(tmp, "kernel.ptx").read_text(), len(sources))
        if modules is None:
            return None
        cubins = []
        for module, where in zip(modules, wheres):
            Path(tmp, "kernel.ptx").write_text(module)
            _nvcc(["kernel.ptx", "-o", "kernel.cubin"], arch, tmp, where)
            cubins.append(Path(tmp, "kernel.cubin").read_bytes())
        return cubins


def nvcc_compile_many(sources: list[str], arch: str, wheres: list[str], batch: bool = True) -> list[bytes]:
    """The cubin of each source: those sharing a preamble in one batch (nvcc_compile_batch), the rest, and any batch
    the cut refuses, one by one."""
    groups: dict[str, list[int]] = {}
    for n, source in enumerate(sources):
        groups.setdefault(nvcc_batch.preamble(source) if batch else str(n), []).append(n)
    cubins: dict[int, bytes] = {}
    for members in groups.values():
        if len(members) > 1:
            batched = nvcc_compile_batch([sources[n] for n in members], arch, [wheres[n] for n in members])
            if batched is not None:
                cubins.update(zip(members, batched))
                continue
        for n in members:
            cubins[n] = nvcc_compile(sources[n], arch, wheres[n])
    return [cubins[n] for n in range(len(sources))]


def lower_checked(variant: Variant, arch: str) -> tuple[LaunchSpec, str]:
    """Lower the variant and read its launch spec (checked against its declaration); returns (spec, CUDA source)."""
    if arch not in ARCHES:
        raise BuildError(f"unknown arch {arch!r}; this build knows {sorted(ARCHES)}")
    os.environ.setdefault("TILELANG_CLEANUP_TEMP_FILES", "1")
    try:
        prim_func, device_func, source = lower(variant, arch)
    except BuildError:
        raise
    except Exception as exc:  # TileLang raises many types; name the variant
        raise BuildError(f"{variant.kernel} [{variant.key}]: lowering failed: {type(exc).__name__}: {exc}") from exc
    return launch_spec(variant, prim_func, device_func, source), source


def compile_variants(variants: list[Variant], arch: str = "sm90", batch: bool = True) -> list[CompiledVariant]:
    """Lower, compile and describe variants; those sharing a preamble share nvcc's front-end pass unless `batch` is
    False (the cubins are the same bytes either way). Pure: writes nothing outside a temp dir."""
    lowered = lower_variants(variants, arch)
    cubins = nvcc_compile_many([source for _, source in lowered], arch, [where(v) for v in variants], batch)
    hashes = {k: source_sha256(k) for k in {v.kernel for v in variants}}  # ~40 ms a kernel: once, not once a variant
    return [
        CompiledVariant(v, arch, spec, cubin, cache_key(v, arch, hashes[v.kernel]), hashes[v.kernel]).serving(v)
        for v, (spec, _), cubin in zip(variants, lowered, cubins)
    ]


def where(variant: Variant) -> str:
    """The variant as an error message names it."""
    return f"{variant.kernel} [{variant.key}]"


def lower_variants(variants: list[Variant], arch: str = "sm90") -> list[tuple[LaunchSpec, str]]:
    """Each variant lowered and checked (lower_checked): its launch spec and CUDA source, for nvcc_compile_many."""
    return [lower_checked(v, arch) for v in variants]


def compile_variant(variant: Variant, arch: str = "sm90") -> CompiledVariant:
    """Lower, compile and describe one variant. Pure: writes nothing outside a temp dir."""
    return compile_variants([variant], arch)[0]
