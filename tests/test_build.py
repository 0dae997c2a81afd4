"""The real build pipeline on a small set: TileLang lowering, nvcc, cache, manifest."""

import json

import pytest

from build_tools.artifacts import BuildCache
from build_tools.build import build_variants
from build_tools.cli import cubin_arch
from build_tools.compile import BuildError, compile_variant, expr_text
from build_tools.ops import Variant
from build_tools.sweep import load_shapeset, shard, sweep
from tkaot._spec import LaunchSpec, check_grid_expr, compile_grid
from tkaot.errors import ManifestError

SMALL = [
    Variant.make("rmsnorm", dict(hidden=512, dtype="bfloat16", with_weight=True, with_residual=True, with_rstd=True)),
    Variant.make("rmsnorm", dict(hidden=7168, dtype="float32", with_weight=False, with_residual=False, with_rstd=False)),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory, build_cache):
    out = tmp_path_factory.mktemp("art")
    report = build_variants(SMALL, out, "sm90", jobs=1, cache=BuildCache(build_cache))
    return out, report


def test_build_writes_manifest_and_sm90a_cubins(built):
    out, report = built
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema"] == 1 and manifest["arch"] == "sm90"
    assert manifest["provenance"]["tilelang"] == "0.1.15"
    assert "compute_90a" in " ".join(manifest["provenance"]["nvcc_flags"])
    assert [e["key"] for e in manifest["variants"]] == sorted(v.key for v in SMALL)
    # nothing that changes without a cubin or launch spec changing: cache keys and source hashes live beside it
    assert "kernels" not in manifest and all(set(e) == {"kernel", "key", "static", "launch", "cubin"} for e in manifest["variants"])
    info = json.loads((out / "build-info.json").read_text())
    assert set(info["kernels"]) == {"rmsnorm"} and len(info["kernels"]["rmsnorm"]["source_sha256"]) == 64
    assert {(v["kernel"], v["key"]) for v in info["variants"]} == {(v.kernel, v.key) for v in SMALL}
    assert all(len(v["cache_key"]) == 64 for v in info["variants"])
    # one variant a line
    lines = (out / "manifest.json").read_text().splitlines()
    assert sum(line.startswith('  {"cubin"') for line in lines) == len(SMALL)
    for e in manifest["variants"]:
        cubin = (out / "cubins" / f"{e['cubin']}.cubin").read_bytes()
        assert cubin_arch(cubin) == "sm_90a"
        spec = LaunchSpec.from_json(e["launch"])
        assert spec.symbol in cubin.decode("latin-1")
        assert spec.block == (128, 1, 1)


def test_launch_spec_follows_generated_kernel(built):
    out, _ = built
    manifest = json.loads((out / "manifest.json").read_text())
    entry = next(e for e in manifest["variants"] if "hidden=512" in e["key"])
    spec = LaunchSpec.from_json(entry["launch"])
    names = [p.name for p in spec.params]
    # the generated kernel declares pointers first, then scalars; not the PrimFunc's order
    assert names[0] == "out" and "x" in names and names.index("x") < names.index("eps")
    assert {"eps": "f32", "num_tokens": "i32", "x": "ptr"}.items() <= {p.name: p.type for p in spec.params}.items()
    assert spec.grid == ("((num_tokens + 7) // 8)", "batch", "1")  # 512 bf16: 16 threads a row, 8 rows a block
    # a variant without weight or residual drops those pointers from the kernel
    other = LaunchSpec.from_json(next(e for e in manifest["variants"] if "hidden=7168" in e["key"])["launch"])
    assert "weight" not in [p.name for p in other.params] and "residual" not in [p.name for p in other.params]


def test_second_build_is_cache_hit_and_byte_identical(built, tmp_path, build_cache):
    out, first = built
    assert first.built + first.cached == len(SMALL)
    again = build_variants(SMALL, tmp_path, "sm90", jobs=1, cache=BuildCache(build_cache))
    assert again.cached == len(SMALL) and again.built == 0
    assert (tmp_path / "manifest.json").read_bytes() == (out / "manifest.json").read_bytes()
    for cubin in (out / "cubins").iterdir():
        assert (tmp_path / "cubins" / cubin.name).read_bytes() == cubin.read_bytes()


def test_rebuild_without_cache_is_reproducible(built, tmp_path):
    out, _ = built
    fresh = compile_variant(SMALL[0])
    manifest = json.loads((out / "manifest.json").read_text())
    entry = next(e for e in manifest["variants"] if e["key"] == SMALL[0].key)
    import hashlib

    assert hashlib.sha256(fresh.cubin).hexdigest() == entry["cubin"]


def test_batched_cubins_are_those_of_lone_compiles(built):
    """The build compiled SMALL's two rmsnorm variants in one batch (one front-end pass, the PTX cut back into each
    kernel's module); each alone gives the same bytes."""
    import hashlib

    from build_tools.compile import compile_variants

    out, _ = built
    manifest = json.loads((out / "manifest.json").read_text())
    alone = {v.key: hashlib.sha256(c.cubin).hexdigest() for v, c in zip(SMALL, compile_variants(SMALL, batch=False))}
    assert alone == {e["key"]: e["cubin"] for e in manifest["variants"]}


def test_one_nvcc_batch_takes_every_kernel_with_the_same_preamble(tmp_path, monkeypatch):
    """Variants of different kernels whose CUDA shares the text before the kernel go to nvcc together, and each cubin
    is the bytes a lone compile of its source gives."""
    import hashlib

    import build_tools.build
    from build_tools.compile import lower_checked, nvcc_compile, nvcc_compile_many
    from build_tools.nvcc_batch import preamble

    default = load_shapeset("default")
    variants = [next(v for v in default if v.kernel == kernel) for kernel in ("cast_back", "cast_back_generic")]
    sources = [lower_checked(v, "sm90")[1] for v in variants]
    assert preamble(sources[0]) == preamble(sources[1])
    batches = []
    monkeypatch.setattr(build_tools.build, "nvcc_compile_many", lambda s, *a: batches.append(len(s)) or nvcc_compile_many(s, *a))
    build_variants(variants, tmp_path, "sm90", jobs=1, cache=BuildCache(tmp_path / "cache"))
    assert batches == [2]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    alone = {v.key: hashlib.sha256(nvcc_compile(s, "sm90", v.key)).hexdigest() for v, s in zip(variants, sources)}
    assert alone == {e["key"]: e["cubin"] for e in manifest["variants"]}


def test_compile_pipeline_batches_by_preamble(monkeypatch):
    """The pipeline without TileLang or nvcc: lowered variants wait by preamble; a batch of NVCC_BATCH goes to nvcc
    as soon as it is full, before the lowering jobs left, and the rest once every lowering is done, the largest
    first; every variant comes back once, with its own cubin; an error ends the build."""
    import build_tools.build as build

    kernels = {"rmsnorm": 7, "cast_back": 3}  # the fake lowering: rmsnorm's variants one preamble, each cast_back its own
    default = load_shapeset("default")
    variants = [v for kernel, n in kernels.items() for v in [v for v in default if v.kernel == kernel][:n]]
    head = {v: "#include <a.h>\n" if v.kernel == "rmsnorm" else f"#include <{v.key}.h>\n" for v in variants}
    log = []

    def lower(chunk, arch):
        log.append(("lower", len(chunk)))
        return [(None, head[v] + f'extern "C" __global__ void k(int* x) {{ /* {v.key} */ }}\n') for v in chunk]

    def nvcc(sources, arch, wheres):
        log.append(("nvcc", len(sources)))
        return [s.encode() for s in sources]

    class Compiled:
        def __init__(self, v, arch, spec, cubin, key, source):
            self.variant, self.cubin = v, cubin

        def serving(self, v):
            return self

    monkeypatch.setattr(build, "lower_variants", lower)
    monkeypatch.setattr(build, "nvcc_compile_many", nvcc)
    monkeypatch.setattr(build, "CompiledVariant", Compiled)
    monkeypatch.setattr(build, "NVCC_BATCH", 3)
    monkeypatch.setattr(build, "BATCH", 2)
    todo = [(v, f"key{i}") for i, v in enumerate(variants)]
    hashes = {k: "h" for k in kernels}
    chunks = build.schedule([v for v, _ in todo], build.BATCH)
    got = []
    build._compile(todo, chunks, "sm90", hashes, build._InProcess(), 1, got.extend)
    assert sorted(c.variant.key for c in got) == sorted(v.key for v in variants)
    assert all(c.cubin.decode().startswith(head[c.variant]) and c.variant.key in c.cubin.decode() for c in got)
    # rmsnorm (the costlier kernel) lowers first, 2 a job, and each 3 of it go to nvcc before the next lowering; then
    # cast_back, and last the 4 preambles left with one variant each
    lowered, compiled = (lambda n: ("lower", n)), (lambda n: ("nvcc", n))
    assert log == [lowered(2), lowered(2), compiled(3), lowered(2), compiled(3), lowered(1), lowered(2), lowered(1), *[compiled(1)] * 4]

    def broken(sources, arch, wheres):
        raise BuildError("nvcc failed")

    monkeypatch.setattr(build, "nvcc_compile_many", broken)
    log.clear()
    with pytest.raises(BuildError, match="nvcc failed"):
        build._compile(todo, chunks, "sm90", hashes, build._InProcess(), 1, got.extend)
    assert log == [("lower", 2), ("lower", 2)]  # nothing runs after the failure


def test_ptx_cut_refuses_what_it_does_not_know():
    """The batch's PTX is cut only where it holds tagged kernel entries and their extern shared arrays; anything
    else (a global, a device function, an untagged or mangled name) sends the variants to lone compiles."""
    from build_tools.nvcc_batch import batch_source, split_ptx

    head = "#include <x.h>\n"
    kernel = 'extern "C" __global__ void k(float* x) {\n  extern __shared__ float buf[];\n  x[0] = buf[0];\n}\n'
    batch = batch_source([head + kernel, head + kernel])
    assert batch.count(head) == 1 and "k_tkvb0_(" in batch and "k_tkvb1_(" in batch and "buf_tkvb1_[]" in batch
    with pytest.raises(ValueError, match="differ before their kernels"):
        batch_source([head + kernel, "#include <y.h>\n" + kernel])
    top = ".version 9.0\n.target sm_90a\n.address_size 64\n\n"

    def entry(i, index):
        return f".visible .entry k_tkvb{i}_(\n\t.param .u64 k_tkvb{i}__param_0\n)\n{{\n$L__BB{index}_1:\n\tret;\n\n}}\n"

    shared = ".extern .shared .align 16 .b8 buf_tkvb0_[];\n"
    ptx = top + "\t// .globl\tk_tkvb0_\n" + shared + entry(0, 0) + "\t// .globl\tk_tkvb1_\n" + entry(1, 1)
    first, second = split_ptx(ptx, 2)
    assert first == top + "\t// .globl\tk\n.extern .shared .align 16 .b8 buf[];\n\n" + entry(0, 0).replace("_tkvb0_", "") + "\n"
    assert second == top + "\t// .globl\tk\n\n" + entry(1, 0).replace("_tkvb1_", "") + "\n"
    assert split_ptx(ptx.replace("\t// .globl\tk_tkvb1_", ".global .align 4 .u32 table[1];"), 2) is None
    assert split_ptx(ptx.replace(".extern .shared .align 16 .b8 buf_tkvb0_[]", ".shared .align 4 .b8 _ZZ9k_tkvb0_E3red[4]"), 2) is None
    assert split_ptx(ptx, 3) is None  # a variant without its entry


def test_damaged_cache_entry_is_rebuilt(tmp_path, build_cache):
    cache = BuildCache(build_cache)
    build_variants(SMALL[:1], tmp_path / "a", "sm90", cache=cache)
    from build_tools.compile import cache_key

    key = cache_key(SMALL[0], "sm90")
    _, cubin_path = cache._paths(key)
    cubin_path.write_bytes(b"garbage")
    report = build_variants(SMALL[:1], tmp_path / "b", "sm90", cache=cache)
    assert report.built == 1


def test_lowered_kernel_must_match_its_declaration(monkeypatch):
    """A declaration that names an argument the kernel lacks, and lacks one it has, stops the build."""

    import build_tools.compile
    from build_tools.ops import declaration, load_kernel_module

    decl = declaration("rmsnorm")
    # eps left out, a bogus dim added, and the first dim passed but not declared a dim
    wrong = decl.replace(params=(*(a for a in decl.params if a != "eps"), decl.dims[0]), dims=(*decl.dims[1:], "bogus"))
    monkeypatch.setattr(build_tools.compile, "declaration", lambda kernel: wrong)
    monkeypatch.setattr(load_kernel_module("rmsnorm"), "DECL", wrong)
    with pytest.raises(BuildError, match=r"does not match its declaration") as err:
        compile_variant(SMALL[0])
    message = str(err.value)
    assert "undeclared ['eps']" in message and "declared but absent ['bogus']" in message
    assert f"undeclared [{decl.dims[0]!r}]" in message  # a dim the declaration left out


def test_source_hash_covers_the_declaration_not_its_neighbours(monkeypatch):
    """A kernel's cache key covers its sources and its declaration; another kernel's declaration changing in the
    same module (or a declaration's ops) rebuilds nothing."""
    from build_tools import ops
    from tkaot._quant import kernels

    names = {str(p.relative_to(p.parents[2])) for p in ops.source_files("rmsnorm")}
    assert {"kernels_src/norm/rmsnorm.py", "kernels_src/norm/row_sum.py"} <= names
    before = ops.source_sha256("rmsnorm")
    monkeypatch.setattr(kernels, "SWIGLU", kernels.SWIGLU.replace(params=(*kernels.SWIGLU.params, "extra")))
    monkeypatch.setitem(ops.DECLARATIONS, "rmsnorm", kernels.RMSNORM.replace(ops=("tkaot.quant.elsewhere",)))
    assert ops.source_sha256("rmsnorm") == before
    monkeypatch.setitem(ops.DECLARATIONS, "rmsnorm", kernels.RMSNORM.replace(params=(*kernels.RMSNORM.params, "extra")))
    assert ops.source_sha256("rmsnorm") != before
    # a value the source imports from the runtime (cast.py: STOCHASTIC_PAIRS) is part of the key
    before = ops.source_sha256("cast")
    monkeypatch.setattr(kernels, "STOCHASTIC_PAIRS", (*kernels.STOCHASTIC_PAIRS, ("float16", "e4m3")))
    assert ops.source_sha256("cast") != before


def test_manifest_round_trip(built):
    out, _ = built
    manifest = json.loads((out / "manifest.json").read_text())
    for e in manifest["variants"]:
        assert LaunchSpec.from_json(e["launch"]).to_json() == e["launch"]


@pytest.mark.parametrize(
    "expr",
    ["__import__('os').system('x')", "num_tokens.bit_length()", "num_tokens ** 2", "[1][0]", "lambda: 1", "1.5", "open", "unknown_dim"],
)
def test_grid_grammar_refuses_non_arithmetic(expr):
    with pytest.raises(ManifestError):
        check_grid_expr(expr, {"num_tokens", "batch"})


def test_grid_grammar_accepts_arithmetic():
    f = compile_grid(("((num_tokens + 3) // 4)", "min(batch, 65535)", "1"), ("num_tokens", "batch"), {"num_tokens", "batch"})
    assert f((9, 2)) == (3, 2, 1)


def test_manifest_with_bad_grid_is_refused(built):
    out, _ = built
    launch = json.loads((out / "manifest.json").read_text())["variants"][0]["launch"]
    launch["grid"][0] = "__import__('os').getpid()"
    with pytest.raises(ManifestError):
        LaunchSpec.from_json(launch)


def test_unknown_axis_and_bad_value_are_refused():
    with pytest.raises(ValueError, match="unknown static axes"):
        Variant.make("rmsnorm", dict(hidden=512, dtype="bfloat16", with_weight=True, with_residual=True, with_rstd=True, bogus=1))
    with pytest.raises(ValueError, match="multiple of 16"):
        Variant.make("rmsnorm", dict(hidden=100, dtype="bfloat16", with_weight=True, with_residual=True, with_rstd=True))
    with pytest.raises(ValueError, match="choose one of"):
        Variant.make("rmsnorm", dict(hidden=512, dtype="float16", with_weight=True, with_residual=True, with_rstd=True))


def test_default_shapeset_and_sharding():
    variants = load_shapeset("default")
    hiddens = {v.params["hidden"] for v in variants if v.kernel == "rmsnorm"}
    assert hiddens >= {512, 1536, 2048, 4096, 5120, 7168, 8192}
    parts = [shard(variants, f"{i}/3") for i in range(3)]
    assert sorted(sum(parts, []), key=lambda v: (v.kernel, v.key)) == variants
    with pytest.raises(ValueError):
        shard(variants, "3/3")


def test_sweep_cross_product():
    variants = sweep({"rmsnorm": [{"hidden": [512, 1024], "dtype": "float32", "with_rstd": False}]})
    assert len(variants) == 2 * 1 * 2 * 2 * 1


def test_expr_text_rejects_unknown_vars():
    from tilelang import tvm

    var = tvm.tirx.Var("secret", "int32")
    with pytest.raises(BuildError):
        expr_text(var, {"num_tokens"})


def test_runtime_axes_share_one_cubin_and_each_entry_fixes_its_values(tmp_path, build_cache):
    """cast_back_generic takes the input block at run time (its RUNTIME_AXES): variants differing only in it are one
    lowering and one cubin, each manifest entry naming its block's index among the axis's choices; the runtime reads it."""
    from build_tools.compile import cache_key
    from tkaot._quant.kernels import CAST_BACK_BLOCKS
    from tkaot.registry import _VARIANT_LINE, ArtifactSet

    blocks = ("1x128", "128x128", "32x1")
    shared = [Variant.make("cast_back_generic", dict(in_dtype="e4m3", in_block=b, in_sf="ue8m0", out_dtype="bfloat16")) for b in blocks]
    other = Variant.make("cast_back_generic", dict(in_dtype="e4m3", in_block="1x128", in_sf="fp32", out_dtype="bfloat16"))
    assert len({cache_key(v, "sm90") for v in shared}) == 1 and cache_key(other, "sm90") != cache_key(shared[0], "sm90")
    report = build_variants([*shared, other], tmp_path, "sm90", jobs=1, cache=BuildCache(build_cache))
    assert report.built + report.cached == 4 and report.built in (0, 2)  # two cubins: the shared one and the other sf kind's
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    entries = {e["key"]: e for e in manifest["variants"]}
    assert len({entries[v.key]["cubin"] for v in shared}) == 1 and entries[other.key]["cubin"] != entries[shared[0].key]["cubin"]
    for v, block in zip(shared, blocks):
        assert entries[v.key]["fixed"] == {"in_block": CAST_BACK_BLOCKS.index(block)}
        spec = LaunchSpec.from_json(entries[v.key]["launch"])
        assert "in_block" in {a.name for a in spec.args if a.role == "dim"} and "in_block" in {p.name for p in spec.params}
    lines = [line for line in (tmp_path / "manifest.json").read_text().splitlines() if line.startswith('  {"cubin"')]
    assert len(lines) == 4 and all(_VARIANT_LINE.match(line) for line in lines)  # the registry's one-line fast path
    kernel = ArtifactSet(tmp_path, "test").kernel("cast_back_generic", shared[1].key)
    assert kernel.fixed == {"in_block": CAST_BACK_BLOCKS.index("128x128")}
