"""The backward ops' coverage on CPU: every call TileKernels 2.1.0 takes finds a kernel in the default set.

norm_backward: rmsnorm_backward is specialised at the default widths (bf16); rmsnorm_backward_generic takes hidden
at run time and serves every other width TileKernels takes (a multiple of 32 up to 8192) in either dtype. It branches
on hidden into the body of its width class (kernels_src/norm/rmsnorm_backward.py, ClassTiling), whose tiling must be
norm_backward_tiling's at every width of the class, or a thread would add other elements than the specialised
kernel's does.
swiglu_backward and swiglu_backward_and_per_token_cast: the row width is a runtime value already; the default set
builds every dtype combination TileKernels takes (x and act_x_grad each bf16 or fp32, either output format; E4M3 x
with either gradient dtype, each group and sf kind). Meta tensors stand in for CUDA tensors.
"""

import json
import re
import struct
import warnings

import pytest
import torch

import tkaot
from build_tools.artifacts import BuildCache
from build_tools.build import build_variants
from build_tools.ops import Variant
from tests.fuzz import default_set, launches  # noqa: F401 (launches: a fixture)
from tests.helpers import F32, FP8, meta, serve_ops
from tests.test_launcher import FUNCTION, SIZES, driver  # noqa: F401 (driver: the fake driver fixture)
from tkaot._decl import build_command
from tkaot._quant.kernels import (
    NORM_BACKWARD_MAX_BLOCKS,
    NORM_BACKWARD_THREADS,
    RMSNORM_BACKWARD,
    RMSNORM_BACKWARD_GENERIC,
    norm_backward_tiling,
)
from tkaot.errors import GenericVariantWarning, VariantNotBuilt

BF16 = torch.bfloat16
DTYPES = {"bfloat16": BF16, "float32": torch.float32}
NORM_WIDTHS = range(32, 8193, 32)  # every width TileKernels' CUDA norm_backward takes
SPECIALISED_WIDTHS = (512, 1536, 2048, 4096, 5120, 7168, 8192)  # build_tools/shapesets/quant.toml, bf16


# ---- the generic kernel's width classes


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_width_classes_serve_every_width_with_its_own_tiling(dtype):
    """Each width is served by exactly one class body, whose row threads (a constant) are norm_backward_tiling's; a class
    body's unchecked vectors are in the row at every width of it."""
    tl = pytest.importorskip("tilelang.language")
    from kernels_src.norm.rmsnorm_backward import NUM_THREADS, STAGED_TENSORS, STAGES, width_classes

    classes = width_classes(tl.dynamic("hidden"), dtype)
    assert classes[0].lo == 0 and classes[-1].hi == 8192 and all(a.hi == b.lo for a, b in zip(classes, classes[1:]))
    assert [c.row_threads for c in classes] == sorted({c.row_threads for c in classes})  # one class per thread count
    elem = 2 if dtype == "bfloat16" else 4
    for h in NORM_WIDTHS:
        vec, threads, vectors = norm_backward_tiling(h, dtype)
        (c,) = [c for c in classes if c.lo < h <= c.hi]
        assert (c.vec, c.row_threads) == (vec, threads) and c.vectors >= vectors, h
        # vectors below `sure` are whole in the row for every lane; below `counted`, among the thread's vectors
        assert all((v * threads + threads - 1) * vec + vec <= h for v in range(c.sure)), h
        assert all(v * threads < h // vec for v in range(c.counted)), h
        assert c.slots * h <= c.stage_elems and c.slots == NUM_THREADS // threads
    for c in classes:  # a body's staged rows and its slot sums (which reuse them) fit the shared memory
        assert c.vectors == norm_backward_tiling(c.hi, dtype)[2]  # the loops run no further than the class's widest row
        assert STAGES * STAGED_TENSORS * c.stage_elems * elem <= 227 * 1024 and c.slots_shape[0] * 4 <= 227 * 1024


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_generic_kernel_branches_once_into_a_class_body_of_16_byte_accesses(dtype):
    """The lowered generic kernel: one branch on hidden per width class, in class order, each over exactly that class's
    widths, and its row data moved in 16-byte accesses (cp.async into the stage, vector loads and stores)."""
    tl = pytest.importorskip("tilelang.language")
    from build_tools.compile import lower
    from kernels_src.norm.rmsnorm_backward import width_classes

    _, _, source = lower(Variant.make("rmsnorm_backward_generic", {"dtype": dtype}), "sm90")
    branches = [(int(lo), int(hi)) for lo, hi in re.findall(r"^  if \(\((\d+) < hidden\) && \(hidden <= (\d+)\)\) \{", source, re.M)]
    assert branches == [(c.lo, c.hi) for c in width_classes(tl.dynamic("hidden"), dtype)]
    copies = re.findall(r"cp_async_gs\w*<(\d+)>", source)
    assert copies and set(copies) == {"16"}
    vector = "uint4" if dtype == "bfloat16" else "float4"  # 8 bf16 or 4 fp32
    assert f"*({vector}*)(x_grad + " in source and f"*({vector}*)(weight + " in source


# ---- every call finds a variant of the default set (tests/fuzz.py's `launches` records how each is served)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_every_norm_backward_width_is_served(launches, dtype):  # noqa: F811
    torch_dtype = DTYPES[dtype]
    for hidden in NORM_WIDTHS:
        x = meta(3, hidden, dtype=torch_dtype)
        tkaot.quant.norm_backward(x, x, meta(hidden, dtype=torch_dtype), F32(3), x, 0.5, F32(hidden))
    pass1 = [(kernel, key) for kernel, key in launches if kernel.startswith("rmsnorm_backward")]
    assert [key for _, key in pass1] == [RMSNORM_BACKWARD.key((h, dtype)) for h in NORM_WIDTHS]
    served = {int(key.split(",")[0].split("=")[1]): (kernel, launches.served[kernel, key]) for kernel, key in pass1}
    built = SPECIALISED_WIDTHS if dtype == "bfloat16" else ()
    # with a residual gradient: rmsnorm_backward_residual where the default set builds it, else the generic tier
    residual, generic = ("rmsnorm_backward_residual", "specialised"), ("rmsnorm_backward", "generic")
    assert served == {h: residual if h in built else generic for h in NORM_WIDTHS}
    assert {launches.served[k] for k in launches if k[0] == "weight_grad_reduce"} == {"specialised"}


def test_norm_backward_without_a_residual_gradient_runs_rmsnorm_backward_or_its_plain_kernel(launches):  # noqa: F811
    for hidden in SPECIALISED_WIDTHS:
        x = meta(3, hidden, dtype=BF16)
        tkaot.quant.norm_backward(x, x, meta(hidden, dtype=BF16), F32(3))
        tkaot.quant.norm_backward(x, x, None, F32(3))
    pass1 = [k for k in launches if k[0].startswith("rmsnorm_backward")]
    # with a weight rmsnorm_backward, with neither a weight nor a residual gradient rmsnorm_backward_plain
    expected = [(kernel, RMSNORM_BACKWARD.key((h, "bfloat16"))) for h in SPECIALISED_WIDTHS
                for kernel in ("rmsnorm_backward", "rmsnorm_backward_plain")]  # fmt: skip
    assert pass1 == expected
    assert {launches.served[k] for k in pass1} == {"specialised"}


@pytest.mark.parametrize("kernel", ["rmsnorm_backward_residual", "rmsnorm_backward_plain"])
def test_the_default_set_builds_the_flag_kernels_at_the_specialised_widths(kernel):
    built = {key for name, key in default_set() if name == kernel}
    assert built == {key for name, key in default_set() if name == "rmsnorm_backward"}


def test_the_default_set_builds_one_generic_norm_backward_per_dtype():
    generic = sorted(key for kernel, key in default_set() if kernel == "rmsnorm_backward_generic")
    assert generic == ["dtype=bfloat16", "dtype=float32"]


def swiglu_calls():
    """(op, x_dtype, grad_dtype, fmt, group, sf kind): every combination TileKernels 2.1.0 takes on CUDA."""
    for x in ("bfloat16", "float32"):
        for fmt in ("bf16", "fp32"):
            yield "swiglu_backward", x, x, fmt, 0, "none"  # x and act_x_grad of one dtype
            for grad in ("bfloat16", "float32"):
                yield "swiglu_backward_and_per_token_cast", x, grad, fmt, 0, "none"
    for grad in ("bfloat16", "float32"):
        for group in (32, 128):
            for sf in ("fp32", "pow2", "ue8m0"):
                yield "swiglu_backward_and_per_token_cast", "e4m3", grad, "e4m3", group, sf


SF_FLAGS = {"none": {}, "fp32": {}, "pow2": {"round_sf": True}, "ue8m0": {"round_sf": True, "use_packed_ue8m0": True}}


@pytest.mark.parametrize(
    "call, hidden",
    [(c, h) for c in swiglu_calls() for h in (64, 768, 7168, 7296) if h % max(c[4], 1) == 0],  # hidden: a multiple of the group
    ids=lambda p: "-".join(map(str, p)) if isinstance(p, tuple) else str(p),
)
def test_every_swiglu_backward_dtype_combination_is_specialised(launches, call, hidden):  # noqa: F811
    op, x_dtype, grad_dtype, fmt, group, sf = call
    grad = meta(5, hidden, dtype=DTYPES[grad_dtype])
    if x_dtype == "e4m3":
        x = (FP8(5, 2 * hidden), F32(5, 2 * hidden // group))
        out = tkaot.quant.swiglu_backward_and_per_token_cast(x, grad, fmt, group, **SF_FLAGS[sf])
        assert out[1][0].dtype == torch.float8_e4m3fn and out[0].dtype == BF16
    else:
        x = meta(5, 2 * hidden, dtype=DTYPES[x_dtype])
        kernel_op = getattr(tkaot.quant, op)
        out = kernel_op(x, grad, fmt) if op == "swiglu_backward" else kernel_op(x, grad, fmt, 128)
        assert len(out) == 1 and out[0].dtype == {"bf16": BF16, "fp32": torch.float32}[fmt]
    key = f"x_dtype={x_dtype},grad_dtype={grad_dtype},fmt={fmt},group={group},sf={sf}"
    assert launches == [("swiglu_backward", key)]
    assert launches.served["swiglu_backward", key] == "specialised"


def test_the_default_set_builds_every_swiglu_backward_combination_and_no_more():
    built = {key for kernel, key in default_set() if kernel == "swiglu_backward"}
    wanted = {f"x_dtype={x},grad_dtype={g},fmt={f},group={n},sf={s}" for _, x, g, f, n, s in swiglu_calls()}
    assert built == wanted and len(built) == 20


# ---- the fallback through the op, against real built variants


BUILT = (
    Variant.make("rmsnorm_backward", {"hidden": 512, "dtype": "bfloat16"}),
    Variant.make("rmsnorm_backward_generic", {"dtype": "bfloat16"}),
)


@pytest.fixture(scope="module")
def built_set(tmp_path_factory, build_cache):
    pytest.importorskip("tilelang")
    out = tmp_path_factory.mktemp("norm-backward")
    build_variants(list(BUILT), out, "sm90", jobs=1, cache=BuildCache(build_cache))
    return out


@pytest.fixture
def served(monkeypatch, registry, fake_cuda, built_set, driver):  # noqa: F811 (the imported fixture)
    """norm_backward on meta tensors against the built set; returns the fake driver."""
    from tkaot._quant import norm_backward

    serve_ops(monkeypatch, registry, [norm_backward], [norm_backward._PASS1], built_set)
    return driver


def launched(values: tuple):
    from tkaot._quant import norm_backward

    launcher = norm_backward._PASS1.cache[(0, *values)]
    return getattr(launcher, "__self__", launcher).kernel


def test_the_generic_launch_spec_adds_hidden_to_the_specialised_arguments(built_set):
    manifest = json.loads((built_set / "manifest.json").read_text())
    specs = {e["kernel"]: e["launch"] for e in manifest["variants"]}
    generic = specs["rmsnorm_backward_generic"]
    assert {a[0] for a in generic["args"]} == {*RMSNORM_BACKWARD.args, "hidden"} and ["hidden", "dim", "i32"] in generic["args"]
    assert generic["grid"] == specs["rmsnorm_backward"]["grid"] == ["num_blocks", "1", "1"]
    assert generic["block"] == specs["rmsnorm_backward"]["block"] == [NORM_BACKWARD_THREADS, 1, 1] and generic["pdl"]


def test_a_built_width_stays_specialised(served):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tkaot.quant.norm_backward(meta(3, 512), meta(3, 512), None, F32(3))
    assert launched((512, "bfloat16")).kernel == "rmsnorm_backward"


@pytest.mark.parametrize("hidden, tokens", [(32, 1), (3168, 127), (7776, 4097), (8192, 3)])
def test_an_unbuilt_width_runs_on_the_generic_kernel_with_one_warning(served, hidden, tokens):
    key = RMSNORM_BACKWARD.key((hidden, "bfloat16"))
    x = meta(tokens, hidden)
    with pytest.warns(GenericVariantWarning) as caught:
        tkaot.quant.norm_backward(x, x, None, F32(tokens))
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"no specialised rmsnorm_backward variant [{key}]" in message and build_command("rmsnorm_backward", key, "sm90") in message
    kernel = launched((hidden, "bfloat16"))
    assert (kernel.kernel, kernel.key) == ("rmsnorm_backward_generic", RMSNORM_BACKWARD_GENERIC.key(("bfloat16",)))
    # once per variant; the grid is the op's block count, and the kernel gets hidden and the rows' strides
    served.sizes = [SIZES[p.type] for p in kernel.spec.params]
    served.calls.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tkaot.quant.norm_backward(x, x, None, F32(tokens))
    (record,) = served.calls
    rows_per_block = NORM_BACKWARD_THREADS // norm_backward_tiling(hidden, "bfloat16")[1]
    num_blocks = min(-(-tokens // rows_per_block), NORM_BACKWARD_MAX_BLOCKS)
    assert record[1] == FUNCTION and record[2] == (num_blocks, 1, 1)
    sent = {p.name: struct.unpack("<i", raw)[0] for p, raw in zip(kernel.spec.params, record[6]) if p.type == "i32"}
    assert sent["hidden"] == hidden and sent["num_tokens"] == tokens and sent["num_blocks"] == num_blocks


def test_strict_mode_refuses_the_fallback(served, monkeypatch):
    monkeypatch.setenv("TKAOT_STRICT", "1")
    with pytest.raises(VariantNotBuilt) as refused:
        tkaot.quant.norm_backward(meta(3, 3168), meta(3, 3168), None, F32(3))
    assert refused.value.kernel == "rmsnorm_backward" and refused.value.key == "hidden=3168,dtype=bfloat16"


def test_without_the_generic_variant_the_error_names_the_specialised_one(served):
    x = meta(3, 3168, dtype=torch.float32)  # the built set has no fp32 generic variant
    with pytest.raises(VariantNotBuilt) as refused:
        tkaot.quant.norm_backward(x, x, None, F32(3))
    assert refused.value.key == "hidden=3168,dtype=float32"
    assert "--set hidden=3168 --set dtype=float32" in refused.value.command
