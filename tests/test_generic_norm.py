"""The generic tier of the norm kernels on CPU: rmsnorm_generic (tkaot.quant.norm_forward) and norm_cast_generic
(tkaot.quant.norm_forward_and_per_token_cast).

Their row split is computed in the kernel from the runtime hidden (kernels_src/norm/row_sum.py, RuntimeSplit); it
must be row_split's for every width the ops take, or a thread would sum other elements than the specialised
kernel's thread does. The runtime launches them where no specialised variant is built, with one warning, on a
grid of the specialised kernel's shape. Meta tensors stand in for CUDA ones and a fake driver records the launches.
"""

import json
import re
import struct
import warnings
from pathlib import Path

import pytest
import torch

import tkaot
from tests.helpers import serve_ops
from tests.test_launcher import FUNCTION, SIZES, driver  # noqa: F401 (driver: the fake driver fixture)
from tkaot import _op
from tkaot._decl import build_command
from tkaot._quant.kernels import NORM_CAST_GENERIC, RMSNORM_GENERIC
from tkaot.errors import GenericVariantWarning, VariantNotBuilt

ROOT = Path(__file__).resolve().parent.parent
PREBUILT = ROOT / "prebuilt" / "sm90"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


# ---- the split the kernels compute ----


def helper_threads(helpers: str, hidden: int) -> int:
    """Evaluate the split's device function (log2 of the threads: a sum of `(hidden > W ? A : 0)` terms) at `hidden`."""
    (body,) = re.findall(r"return (\d.*);", helpers)
    shift = sum(int(a) if hidden > int(w) else 0 for w, a in re.findall(r"\(hidden > (\d+) \? (\d+) : 0\)", body))
    return 1 << (shift + int(body.split(" ", 1)[0]))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("multiple", [16, 32])
def test_the_runtime_split_is_row_split_at_every_width(dtype, multiple):
    pytest.importorskip("tilelang")
    from kernels_src.norm.row_sum import MAX_HIDDEN, RuntimeSplit, row_split

    hidden = pytest.importorskip("tilelang.language").dynamic("hidden")
    split = RuntimeSplit(hidden, dtype, multiple)
    most = 0
    for h in range(multiple, MAX_HIDDEN + 1, multiple):
        vec, threads, vectors = row_split(h, dtype)
        assert helper_threads(split.helpers, h) == threads, h
        assert split.vec == vec and threads * vectors * vec >= h and vectors <= split.vectors
        most = max(most, vectors)
    assert split.vectors == most  # the loops run no further than the widest row needs


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("multiple", [16, 32])
def test_each_width_class_is_row_split_at_its_widths(dtype, multiple):
    # norm_cast_generic's default tiling runs the widths past widest_from on the wide split (its shift a constant),
    # the others on the narrow one (a runtime shift, loops to the most vectors those widths give a thread)
    pytest.importorskip("tilelang")
    from kernels_src.norm.row_sum import MAX_HIDDEN, NUM_THREADS, RuntimeSplit, row_split

    split = RuntimeSplit(pytest.importorskip("tilelang.language").dynamic("hidden"), dtype, multiple)
    wide, narrow = split.width_classes()
    assert wide.rows_per_block * wide.row_threads == NUM_THREADS and wide.vectors == split.vectors
    most_narrow = 0
    for h in range(multiple, MAX_HIDDEN + 1, multiple):
        _, threads, vectors = row_split(h, dtype)
        assert (threads == wide.row_threads) == (h > split.widest_from), h
        if h <= split.widest_from:
            most_narrow = max(most_narrow, vectors)
    assert narrow.vectors == most_narrow < split.vectors


def built_widths(kernel: str) -> set[int]:
    manifest = json.loads((PREBUILT / "manifest.json").read_text())
    return {int(e["static"]["hidden"]) for e in manifest["variants"] if e["kernel"] == kernel}


def widths(multiple: int, kernel: str) -> list[int]:
    """Widths (multiples of `multiple`) at every threads-a-row class, none of which the prebuilt set specialises."""
    candidates = (16, 32, 48, 96, 160, 256, 272, 544, 1056, 2080, 2880, 4160, 6208, 8160)
    return [w for w in candidates if w % multiple == 0 and w not in built_widths(kernel)]


# ---- the fallback, through the ops ----


@pytest.fixture
def served(monkeypatch, registry, fake_cuda, driver):  # noqa: F811 (the imported fixture)
    """The norm ops on meta tensors against the prebuilt set; returns the fake driver."""
    from tkaot._quant import norm, norm_cast

    serve_ops(monkeypatch, registry, [norm, norm_cast], [norm._NORM, norm_cast._NORM_CAST], PREBUILT)
    return driver


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def launcher_kernel(kernels: _op.OpKernels, values: tuple):
    launcher = kernels.cache[(0, *values)]
    return getattr(launcher, "__self__", launcher).kernel


def sizes_sent(kernel, record) -> tuple[int, int, int]:
    """(hidden, num_tokens, batch) as one recorded launch passed them."""
    sent = {p.name: struct.unpack("<i", raw)[0] for p, raw in zip(kernel.spec.params, record[6]) if p.type == "i32"}
    return sent["hidden"], sent["num_tokens"], sent["batch"]


def rows_per_block(hidden: int, dtype: str) -> int:
    """A block's rows at `hidden`: 128 / the threads kernels_src/norm/row_sum.py's row_split gives a row (written
    out again here, so this test needs no TileLang)."""
    vec = 16 // (2 if dtype == "bfloat16" else 4)
    pow2 = lambda n: 1 << (n - 1).bit_length()  # noqa: E731
    threads = min(128, max(min(8, pow2(hidden // vec)), pow2(-(-hidden // 32))))
    return 128 // threads


def assert_generic_once(served, call, kernels: _op.OpKernels, generic, values: tuple, hidden: int, dtype: str) -> None:
    """call(*lead) at an unbuilt width warns once, naming the specialised variant and its build command, and runs on the
    `generic` kernel; later calls do not warn; the grid has the specialised kernel's rows a block, and the kernel gets
    hidden."""
    name, key = kernels.kernel, kernels.key(values)
    with pytest.warns(GenericVariantWarning) as caught:
        call(5)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"no specialised {name} variant [{key}]" in message and build_command(name, key, "sm90") in message
    kernel = launcher_kernel(kernels, values)
    assert (kernel.kernel, kernel.key) == (generic.name, generic.key(values[1:]))
    served.sizes = [SIZES[p.type] for p in kernel.spec.params]
    served.calls.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call(2, 37)
    (record,) = served.calls
    assert record[1] == FUNCTION and record[2] == (-(-37 // rows_per_block(hidden, dtype)), 2, 1)
    assert sizes_sent(kernel, record) == (hidden, 37, 2)


def test_a_built_norm_stays_specialised(served):
    from tkaot._quant import norm

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tkaot.quant.norm_forward(meta(3, 7168), meta(7168), 1e-6)
    assert launcher_kernel(norm._NORM, (7168, "bfloat16", True, False, False)).kernel == "rmsnorm"


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("hidden", widths(16, "rmsnorm"))
def test_norm_forward_at_an_unbuilt_width_runs_on_the_generic_kernel(served, hidden, dtype):
    from tkaot._quant import norm

    torch_dtype = DTYPES[dtype]
    values = (hidden, dtype, True, True, True)

    def call(*lead):
        x = meta(*lead, hidden, dtype=torch_dtype)
        return tkaot.quant.norm_forward(x, meta(hidden, dtype=torch_dtype), 1e-6, meta(*lead, hidden, dtype=torch_dtype), with_rstd=True)

    assert_generic_once(served, call, norm._NORM, RMSNORM_GENERIC, values, hidden, dtype)


# sf kind -> norm_forward_and_per_token_cast's keywords that ask for it
SF_KWARGS = {"fp32": {}, "pow2": {"round_sf": True}, "ue8m0": {"round_sf": True, "use_packed_ue8m0": True}}


@pytest.mark.parametrize("sf", list(SF_KWARGS))
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("hidden", widths(32, "norm_cast"))
def test_norm_cast_at_an_unbuilt_width_runs_on_the_generic_kernel(served, hidden, dtype, residual, sf):
    from tkaot._quant import fused as _fused
    from tkaot._quant import norm_cast

    torch_dtype = DTYPES[dtype]
    tiling = _fused.NORM_CAST_RESIDUAL_TILING if residual else _fused.NORM_CAST_TILING
    values = (hidden, dtype, sf, tiling)

    def call(*lead):
        x = meta(*lead, hidden, dtype=torch_dtype)
        r = meta(*lead, hidden, dtype=torch_dtype) if residual else None
        return tkaot.quant.norm_forward_and_per_token_cast(x, meta(hidden, dtype=torch_dtype), 1e-6, "e4m3", 32, r, **SF_KWARGS[sf])

    assert_generic_once(served, call, norm_cast._NORM_CAST, NORM_CAST_GENERIC, values, hidden, dtype)


def test_strict_mode_refuses_the_norm_fallbacks(served, monkeypatch):
    monkeypatch.setenv("TKAOT_STRICT", "1")
    with pytest.raises(VariantNotBuilt) as refused:
        tkaot.quant.norm_forward(meta(3, 2880), meta(2880), 1e-6)
    assert refused.value.kernel == "rmsnorm" and refused.value.key.startswith("hidden=2880,")
    with pytest.raises(VariantNotBuilt) as refused:
        tkaot.quant.norm_forward_and_per_token_cast(meta(3, 2880), meta(2880), 1e-6, "e4m3", 32)
    assert refused.value.kernel == "norm_cast" and refused.value.key.startswith("hidden=2880,")
