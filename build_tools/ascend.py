"""The Ascend 950 build, in two stages.

Stage 1 (any machine, needs TileLang): each variant's Ascend kernel (kernels_src/ascend/) is lowered with
the target {"kind": "ascend"} to AscendC source; its launch spec comes from the host module TileLang
makes beside it (the kernel's own parameter order, the block count as an expression in the dynamic dims,
the dynamic Unified Buffer bytes) and is checked against the kernel's declaration like a CUDA kernel's.
The set gets `sources/<sha256>.asc`, the TileLang headers those sources include (`include/`) and
manifest.json, one entry a variant, in the CUDA sets' schema: the launch spec's grid is (block count, 1,
1), its block (1, 1, 1) and its shared memory the dynamic UB bytes; `source` names the source by sha256,
`requires` lists runtime arguments the kernel takes only one value of. An Ascend module may take some of its
declaration's static axes at run time (`RUNTIME_AXES`): the variants that differ only in those share one
lowering and one source, and each one's entry lists its values of them under `fixed` (an int axis's value, a
string axis's index among its choices), which the launcher passes after the op's arguments.

Stage 2 (a host with CANN, no TileLang): every source is compiled by `bisheng --npu-arch=dav-3510
--cce-aicore-only` and linked by `ld.lld -m aicorelinux` into an executable CCE ELF,
`binaries/<sha256>.o`, which the entry names as `binary`; the runtime loads it with
aclrtBinaryLoadFromData. Without bisheng (or ld.lld) the build stops after stage 1 and says what is
missing.

Both stages are cached by content (the lowering under TKAOT_CACHE_DIR/ascend, keyed like the CUDA build;
binaries by source, flags and bisheng version) and write through temporary names, so a rebuild gives the
same bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from build_tools import ops
from build_tools.artifacts import atomic_write, default_cache_dir, manifest_text, read_manifest, sha256
from build_tools.compile import BuildError, check_declared, expr_text, op_args, tilelang_version
from build_tools.ops import REPO_ROOT, Variant, declaration
from kernels_src.ascend import ASCEND_SOURCES
from tkaot import __version__
from tkaot._spec import MANIFEST_SCHEMA, LaunchSpec, Param

ARCH = "ascend950"
NPU_ARCH = "dav-3510"
BISHENG_FLAGS = ("-O2", "-fPIC", "-std=c++20", "-mllvm", "-cce-aicore-dcpreload-args=false", f"--npu-arch={NPU_ARCH}", "--cce-aicore-only")
LINK_FLAGS = ("-m", "aicorelinux", "-Ttext", "0", "--no-mmap-output-file")
# Unified Buffer bytes a vector core gives a kernel that runs SIMT code
UB_LIMIT = 216 * 1024
SOURCES, BINARIES, INCLUDE = "sources", "binaries", "include"
_SCALARS = {"int32": "i32", "int64": "i64", "float32": "f32"}
# Raised when what stage 1 writes for a variant changes for the same inputs, so cached lowerings are redone
LOWERING_VERSION = 1


def missing_tools() -> list[str]:
    """What stage 2 needs and this machine lacks: bisheng and the CCE-capable ld.lld (BISHENG_HOME/bin or PATH)."""
    return [tool for tool in ("bisheng", "ld.lld") if find_tool(tool) is None]


def find_tool(name: str) -> str | None:
    home = os.environ.get("BISHENG_HOME")
    if home and os.access(os.path.join(home, "bin", name), os.X_OK):
        return os.path.join(home, "bin", name)
    return shutil.which(name)


def tools_message(missing: list[str]) -> str:
    return (
        f"binaries not built: {' and '.join(missing)} not found (CANN's Ascend toolkit: source its set_env.sh, "
        f"or set BISHENG_HOME). On a host with CANN, compile these sources with:\n"
        f"    tkaot-build build --arch {ARCH} --sources DIR --out DIR"
    )


def ascend_module(kernel: str) -> ModuleType:
    """The kernel's Ascend TileLang module (imports TileLang)."""
    module = importlib.import_module(ASCEND_SOURCES[kernel])
    if getattr(module, "DECL", None) is not declaration(kernel):
        raise BuildError(f"{module.__name__} does not build kernel {kernel!r}: its DECL is not that declaration")
    return module


def _source_file(name: str) -> Path:
    return REPO_ROOT.joinpath(*name.split(".")).with_suffix(".py")


def source_files(kernel: str) -> list[Path]:
    """The kernel's Ascend module and the kernels_src modules it imports (transitively)."""
    from build_tools.ops import kernels_src_closure

    return kernels_src_closure(_source_file(ASCEND_SOURCES[kernel]))


@functools.cache
def source_sha256(kernel: str) -> str:
    """Hash of the Ascend sources and of what they take from the runtime (build_tools.ops.sources_sha256)."""
    from build_tools.ops import sources_sha256

    return sources_sha256(kernel, source_files(kernel))


def unsupported(variant: Variant) -> str | None:
    """Why the variant has no Ascend kernel (None: it has one). Reads the module's `unsupported`."""
    if variant.kernel not in ASCEND_SOURCES:
        return f"{variant.kernel} has no Ascend kernel yet"
    return ascend_module(variant.kernel).unsupported(**variant.params)


def select(variants: list[Variant]) -> tuple[list[Variant], dict[str, int]]:
    """(the variants with an Ascend kernel, {reason: how many were left out})."""
    kept: list[Variant] = []
    left: dict[str, int] = {}
    for v in variants:
        why = unsupported(v)
        if why is None:
            kept.append(v)
        else:
            reason = f"{v.kernel}: {why}"
            left[reason] = left.get(reason, 0) + 1
    return kept, left


@dataclass(frozen=True)
class Lowered:
    """One variant after stage 1."""

    variant: Variant
    spec: LaunchSpec
    source: str  # AscendC
    requires: dict
    fixed: dict  # the static axes the kernel takes at run time -> this variant's runtime values of them


def runtime_axes(kernel: str) -> tuple[str, ...]:
    """The static axes of the kernel's declaration that its Ascend module takes at run time (RUNTIME_AXES)."""
    return ops.runtime_axes(ascend_module(kernel))


def build_static(variant: Variant) -> dict:
    """The static values the Ascend module builds the variant from: all but its runtime axes."""
    return ops.build_static(variant, runtime_axes(variant.kernel))


def fixed_values(variant: Variant) -> dict:
    """The variant's values of the axes its Ascend kernel takes at run time, as the kernel takes them."""
    return ops.fixed_values(variant, runtime_axes(variant.kernel))


def cache_key(variant: Variant) -> str:
    """The lowering's key: the same for variants that differ only in axes the kernel takes at run time."""
    inputs = {
        "kernel": variant.kernel,
        "static": [[k, v] for k, v in build_static(variant).items()],
        "source": source_sha256(variant.kernel),
        "arch": ARCH,
        "tilelang": tilelang_version(),
        "lowering": LOWERING_VERSION,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def lower(variant: Variant) -> Lowered:
    """Lower one variant for Ascend and describe its launch. Pure: writes nothing."""
    import tilelang
    from tilelang import tvm

    where = f"{variant.kernel} [{variant.key}] for {ARCH}"
    module = ascend_module(variant.kernel)
    target = tvm.target.Target({"kind": "ascend"})
    try:
        with target:
            prim_func = module.build(**build_static(variant))
            artifact = tilelang.lower(prim_func, target=target)
    except Exception as exc:  # TileLang raises many types; name the variant
        raise BuildError(f"{where}: lowering failed: {type(exc).__name__}: {exc}") from exc
    spec = launch_spec(prim_func, artifact, declaration(variant.kernel), where, runtime_axes(variant.kernel))
    requires = dict(getattr(module, "REQUIRES", {}))
    unknown = sorted(set(requires) - {a.name for a in spec.args})
    if unknown:
        raise BuildError(f"{where}: REQUIRES names {unknown}, which are not the kernel's arguments")
    return Lowered(variant, spec, artifact.kernel_source, requires, fixed_values(variant))


def host_launch(host_mod, symbol: str) -> tuple[list[str], object, object]:
    """(argument names in the kernel's order, block count expression, dynamic UB bytes) of the host module's
    call of `symbol`: TileLang passes the kernel's arguments, then its launch values."""
    from tilelang import tvm

    tirx = tvm.tirx
    calls = []

    def visit(node):
        if isinstance(node, tirx.Call) and node.op.name == "tirx.tvm_call_packed" and str(node.args[0].value) == symbol:
            calls.append(node)

    for _, func in host_mod.functions.items():
        tirx.stmt_functor.post_order_visit(func.body, visit)
    if len(calls) != 1:
        raise BuildError(f"the host module calls {symbol} {len(calls)} times; expected once")
    args = list(calls[0].args[1:])
    names = [a.name for a in args[:-2] if isinstance(a, tirx.Var)]
    if len(names) != len(args) - 2:
        raise BuildError(f"the host module passes {symbol} something other than its parameters: {args[:-2]}")
    return names, args[-2], args[-1]


def launch_spec(prim_func, artifact, decl, where: str, runtime: tuple[str, ...] = ()) -> LaunchSpec:
    """The launch spec of a lowered Ascend kernel, checked against its declaration (plus the static axes it takes
    at run time, as dims) and the UB limit."""
    args = op_args(prim_func)
    check_declared(args, decl, where, runtime)
    functions = list(artifact.device_mod.functions.items())
    if len(functions) != 1:
        raise BuildError(f"{where}: expected one device kernel, TileLang made {len(functions)}")
    gvar, func = functions[0]
    symbol = str(func.attrs.get("global_symbol", gvar.name_hint))
    by_name = {a.name: a for a in args}
    params = []
    for p in func.params:
        ptype = "ptr" if p.dtype == "handle" else _SCALARS.get(str(p.dtype))
        if ptype is None or p.name not in by_name or by_name[p.name].type != ptype:
            raise BuildError(f"{where}: kernel parameter {p.name} ({p.dtype}) maps to no op argument; the runtime cannot fill it")
        params.append(Param(p.name, ptype))
    names, blocks, ub = host_launch(artifact.host_mod, symbol)
    if names != [p.name for p in params]:
        raise BuildError(f"{where}: the host module passes {names}, the kernel declares {[p.name for p in params]}")
    dims = {a.name for a in args if a.role == "dim"}
    extent = func.attrs["thread_extent"]
    if set(map(str, extent)) != {"blockIdx.x"}:
        raise BuildError(f"{where}: an Ascend kernel launches a 1-D grid of blocks, this one {dict(extent)}")
    grid = (expr_text(blocks, dims), "1", "1")
    if grid[0] != expr_text(extent["blockIdx.x"], dims):
        raise BuildError(f"{where}: the host module launches {grid[0]} blocks, the kernel says {extent['blockIdx.x']}")
    if not hasattr(ub, "value"):
        raise BuildError(f"{where}: dynamic UB size {ub} depends on runtime values")
    if int(ub.value) > UB_LIMIT:
        raise BuildError(f"{where}: the kernel needs {int(ub.value)} bytes of Unified Buffer, more than the {UB_LIMIT} a vector core has")
    spec = LaunchSpec(symbol=symbol, params=tuple(params), args=args, grid=grid, block=(1, 1, 1), smem=int(ub.value))
    spec.check()
    return spec


class LoweringCache:
    """cache_key -> the stage-1 result (spec, requires, source) as one JSON file; a damaged entry is redone."""

    def __init__(self, root: Path | None = None):
        self.root = (Path(root) if root else default_cache_dir()) / "ascend"

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, variant: Variant, key: str) -> Lowered | None:
        try:
            data = json.loads(self._path(key).read_text())
            if sha256(data["source"].encode()) != data["source_sha256"]:
                return None
            return Lowered(variant, LaunchSpec.from_json(data["launch"]), data["source"], data["requires"], fixed_values(variant))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, lowered: Lowered) -> None:
        data = {
            "launch": lowered.spec.to_json(),
            "requires": lowered.requires,
            "source": lowered.source,
            "source_sha256": sha256(lowered.source.encode()),
        }
        atomic_write(self._path(key), json.dumps(data, sort_keys=True).encode())


def _lower_in_worker(variant: Variant) -> Lowered:
    return lower(variant)


def lower_all(variants: list[Variant], jobs: int, cache: LoweringCache, progress=None) -> tuple[list[Lowered], int]:
    """Stage 1 for every variant: (results, how many lowerings were made rather than read from the cache). Variants
    that share a lowering (they differ only in axes their kernel takes at run time) are lowered once."""
    done, todo, sharing = [], [], {}  # sharing: key -> the variants after the first that share its lowering
    for v in variants:
        key = cache_key(v)
        if key in sharing:
            sharing[key].append(v)
            continue
        sharing[key] = []
        hit = cache.get(v, key)
        if hit is None:
            todo.append((v, key))
        else:
            done.append(hit)
            if progress:
                progress(v, True)
    if jobs > 1 and len(todo) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = pool.map(_lower_in_worker, [v for v, _ in todo])
            for (v, key), lowered in zip(todo, results):
                cache.put(key, lowered)
                done.append(lowered)
                if progress:
                    progress(v, False)
    else:
        for v, key in todo:
            lowered = lower(v)
            cache.put(key, lowered)
            done.append(lowered)
            if progress:
                progress(v, False)
    first = {cache_key(low.variant): low for low in done}
    for key, others in sharing.items():
        for v in others:  # the shared lowering, with the variant's own runtime values
            done.append(dataclasses.replace(first[key], variant=v, fixed=fixed_values(v)))
            if progress:
                progress(v, True)
    return done, len(todo)


def entry(lowered: Lowered) -> dict:
    data = {
        "kernel": lowered.variant.kernel,
        "key": lowered.variant.key,
        "static": dict(lowered.variant.static),
        "launch": lowered.spec.to_json(),
        "source": sha256(lowered.source.encode()),
    }
    if lowered.requires:
        data["requires"] = dict(sorted(lowered.requires.items()))
    if lowered.fixed:
        data["fixed"] = dict(lowered.fixed)
    return data


def template_headers() -> dict[str, bytes]:
    """The TileLang headers the generated sources include (tl_templates/ascend/*.h), by path under include/."""
    from tilelang.env import TILELANG_TEMPLATE_PATH

    root = Path(TILELANG_TEMPLATE_PATH)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "tl_templates" / "ascend").glob("*.h"))}


def write_sources(out_dir: Path, lowered: list[Lowered]) -> dict:
    """Stage 1's output: sources/, include/ and manifest.json (entries already there are kept unless replaced)."""
    out_dir = Path(out_dir)
    old = read_manifest(out_dir)
    entries: dict[tuple[str, str], dict] = {}
    if old is not None:
        if old.get("arch") != ARCH or old.get("schema") != MANIFEST_SCHEMA:
            raise BuildError(f"{out_dir} holds a manifest for arch {old.get('arch')} schema {old.get('schema')}; use another --out")
        entries = {(e["kernel"], e["key"]): e for e in old["variants"]}
    for name, data in template_headers().items():
        path = out_dir / INCLUDE / name
        if not path.exists() or path.read_bytes() != data:
            atomic_write(path, data)
    for low in lowered:
        text = low.source.encode()
        path = out_dir / SOURCES / f"{sha256(text)}.asc"
        if not path.exists() or sha256(path.read_bytes()) != sha256(text):
            atomic_write(path, text)
        new = entry(low)
        was = entries.get((new["kernel"], new["key"]))
        if was is not None and was.get("source") == new["source"] and "binary" in was:
            new["binary"] = was["binary"]  # the same source: its binary stays
        entries[(new["kernel"], new["key"])] = new
    provenance = dict(old.get("provenance", {})) if old else {}
    provenance.update({"tilelang": tilelang_version(), "npu_arch": NPU_ARCH})
    return _write_manifest(out_dir, entries, provenance)


def _write_manifest(out_dir: Path, entries: dict, provenance: dict) -> dict:
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "arch": ARCH,
        "tkaot_version": __version__,
        "provenance": provenance,
        "variants": [entries[k] for k in sorted(entries)],
    }
    atomic_write(Path(out_dir) / "manifest.json", manifest_text(manifest).encode())
    return manifest


@functools.lru_cache(maxsize=1)
def bisheng_version() -> str:
    out = subprocess.run([find_tool("bisheng"), "--version"], capture_output=True, text=True).stdout
    match = re.search(r"version\s+(\S+)", out)
    return match.group(1) if match else (out.strip().splitlines() or ["unknown"])[0]


def compile_source(source: bytes, include: Path, where: str) -> bytes:
    """bisheng then ld.lld: one AscendC source -> an executable CCE ELF (fixed file names: the same bytes each time)."""
    with tempfile.TemporaryDirectory(prefix="tkaot-bisheng-") as tmp:
        Path(tmp, "kernel.asc").write_bytes(source)
        steps = (
            [find_tool("bisheng"), *BISHENG_FLAGS, f"-I{include}", "kernel.asc", "-o", "kernel.rel.o"],
            [find_tool("ld.lld"), *LINK_FLAGS, "kernel.rel.o", "-o", "kernel.o"],
        )
        for cmd in steps:
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
            if proc.returncode != 0:
                raise BuildError(f"{where}: {Path(cmd[0]).name} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
        data = Path(tmp, "kernel.o").read_bytes()
    if not data:
        raise BuildError(f"{where}: the linker wrote an empty binary")
    return data


def compile_binaries(out_dir: Path, sources_dir: Path | None = None, cache_root: Path | None = None, progress=None) -> tuple[dict, int]:
    """Stage 2: compile every source of the set in `sources_dir` (default: out_dir itself) into out_dir/binaries/
    and name each binary in out_dir's manifest. Needs bisheng and ld.lld, not TileLang. Returns (manifest, compiled)."""
    out_dir = Path(out_dir)
    sources_dir = Path(sources_dir or out_dir)
    missing = missing_tools()
    if missing:
        raise BuildError(tools_message(missing))
    manifest = read_manifest(sources_dir)
    if manifest is None or manifest.get("arch") != ARCH:
        raise BuildError(f"{sources_dir} holds no {ARCH} manifest.json (stage 1: tkaot-build build --arch {ARCH} with TileLang)")
    if sources_dir.resolve() != out_dir.resolve():
        for path in sorted((sources_dir / INCLUDE).rglob("*.h")):
            atomic_write(out_dir / INCLUDE / path.relative_to(sources_dir / INCLUDE), path.read_bytes())
    flags = [*BISHENG_FLAGS, *LINK_FLAGS]
    cache = (Path(cache_root) if cache_root else default_cache_dir()) / "ascend-binaries"
    include = (out_dir / INCLUDE).resolve()
    compiled = 0
    entries = {}
    for e in manifest["variants"]:
        e = dict(e)
        source = (sources_dir / SOURCES / f"{e['source']}.asc").read_bytes()
        if sha256(source) != e["source"]:
            raise BuildError(f"{sources_dir}: source of {e['kernel']} [{e['key']}] does not match its sha256")
        if sources_dir.resolve() != out_dir.resolve():
            atomic_write(out_dir / SOURCES / f"{e['source']}.asc", source)
        key = sha256(json.dumps([e["source"], flags, bisheng_version(), _headers_digest(include)]).encode())
        cached = cache / key[:2] / f"{key}.o"
        binary = cached.read_bytes() if cached.is_file() else None
        if binary is None:
            binary = compile_source(source, include, f"{e['kernel']} [{e['key']}]")
            atomic_write(cached, binary)
            compiled += 1
        digest = sha256(binary)
        path = out_dir / BINARIES / f"{digest}.o"
        if not path.exists() or sha256(path.read_bytes()) != digest:
            atomic_write(path, binary)
        e["binary"] = digest
        entries[(e["kernel"], e["key"])] = e
        if progress:
            progress(e, compiled)
    provenance = dict(manifest.get("provenance", {}))
    provenance.update({"bisheng": bisheng_version(), "bisheng_flags": list(BISHENG_FLAGS), "link_flags": list(LINK_FLAGS)})
    return _write_manifest(out_dir, entries, provenance), compiled


def _headers_digest(include: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(include.rglob("*.h")):
        digest.update(str(path.relative_to(include)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()
