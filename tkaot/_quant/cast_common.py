"""Scale-factor layouts, and the input rules tkaot.quant's casts share, declared once as tkaot._validate data.

Formats: "e4m3" data is torch.float8_e4m3fn; "e2m1" data is torch.int8 holding two FP4 codes a byte. Scale-factor
kinds: "fp32", "pow2" (fp32 powers of two), "ue8m0" (exponent bytes packed four to an int32) and "e4m3"; layouts "row"
and "col" (column-major with the token stride padded to 16 bytes, DeepGEMM's layout). The declared pieces below are
Rules, Lets and Tensors that the casts' Signatures (tkaot/_quant/casts.py, weight_casts.py) place; no op lives here.
"""

from __future__ import annotations

import torch

from tkaot._quant.kernels import MAX_CAST_HIDDEN
from tkaot._validate import Let, Rule, Tensor

_BF16, _F32, _F8, _I8, _I32 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int8, torch.int32
_FMT_DTYPE = {"e4m3": _F8, "e2m1": _I8}
_SF_DTYPE = {"fp32": _F32, "pow2": _F32, "ue8m0": _I32, "e4m3": _F8}
_SF_ITEM_BYTES = {"fp32": 4, "pow2": 4, "ue8m0": 4, "e4m3": 1}
IN_BLOCKS = ((1, 16), (1, 32), (1, 64), (1, 128), (32, 32), (128, 128))  # the scale blocks of a pre-quantized input


def _align(a: int, b: int) -> int:
    return -(-a // b) * b


def _sf_cols(k_blocks: int, kind: str) -> int:
    return -(-k_blocks // 4) if kind == "ue8m0" else k_blocks


def _alloc_sf(m_blocks: int, k_blocks: int, kind: str, layout: str, device) -> torch.Tensor:
    """A new sf tensor; column-major ones pad the token stride to 16 bytes (TMA alignment)."""
    dtype, cols = _SF_DTYPE[kind], _sf_cols(k_blocks, kind)
    if layout == "row":
        return torch.empty((m_blocks, cols), dtype=dtype, device=device)
    pitch = max(_align(m_blocks, 16 // _SF_ITEM_BYTES[kind]), 1)
    storage = torch.empty((cols, pitch), dtype=dtype, device=device)
    return storage.as_strided((m_blocks, cols), (1, pitch))


def _sf_kernel_stride(t: torch.Tensor, kind: str, layout: str) -> int:
    """An sf tensor's row stride as the kernels address it (bytes for packed UE8M0)."""
    stride = t.stride(0) if layout == "row" else t.stride(1)
    return stride * 4 if kind == "ue8m0" else stride


# The sf-kind rule, the one place it lives: packed UE8M0 holds powers of two, so it needs round_sf; the kind the
# options ask for (the fused ops' Signatures place these two; the casts' take them through sf_kind_rules)
SF_PACKED_RULE = Rule(
    "use_packed_ue8m0", "round_sf or not use_packed_ue8m0", "used with round_sf=True (UE8M0 holds powers of two only)",
    actual="'round_sf=False'",
)  # fmt: skip
SF_KIND = Let("sf_kind", "'ue8m0' if use_packed_ue8m0 else 'pow2' if round_sf else 'fp32'")


# ---- declared pieces: each takes `at`, the tensor after which its rules are checked --------------------------------


def width_rule(label: str, at: str) -> Rule:
    """Rows of 1 to MAX_CAST_HIDDEN channels (`hidden`, logical), the widths the cast kernels are declared for; placed at
    "<tensor>.shape", before the layout checks (an empty row's strides say nothing)."""
    return Rule(label, f"0 < hidden <= {MAX_CAST_HIDDEN}", f"1 to {MAX_CAST_HIDDEN} channels wide (the cast kernels' limit)",
                actual="f'{hidden} channels'", after=at)  # fmt: skip


def fmt_rule(at: str, fmts: tuple = ("e4m3", "e2m1"), why: str = "") -> Rule:
    return Rule("fmt", " or ".join(f"fmt == {f!r}" for f in fmts), " or ".join(map(repr, fmts)) + why, actual="repr(fmt)", after=at)


def sf_kind_rules(at: str, e4m3_sf: bool = True) -> tuple:
    """SF_PACKED_RULE and, for casts that offer E4M3 scale factors, their exclusion of round_sf; binds kind."""
    if not e4m3_sf:
        return SF_PACKED_RULE.replace(after=at), Let("kind", SF_KIND.value, after=at)
    return (
        SF_PACKED_RULE.replace(after=at),
        Rule("use_e4m3_sf", "not (round_sf and use_e4m3_sf)", "False when round_sf=True", actual="'both True'", after=at),
        Let("kind", "'ue8m0' if use_packed_ue8m0 else 'pow2' if round_sf else 'e4m3' if use_e4m3_sf else 'fp32'", after=at),
    )


def block_rules(arg: str, value: str, allowed: tuple, at: str, given: bool = False) -> tuple:
    """`arg` is a pair of ints among `allowed` (given: not None, for a pre-quantized input), bound as the tuple `value`."""
    rules = (Rule(arg, f"{arg} is not None", "given for a pre-quantized (data, sf) input", actual="None", after=at),) if given else ()
    return (
        *rules,
        Rule(arg, f"isinstance({arg}, (tuple, list)) and len({arg}) == 2 and isinstance({arg}[0], int) and isinstance({arg}[1], int)",
             "a pair of ints", actual=f"repr({arg})", after=at),
        Let(value, f"(int({arg}[0]), int({arg}[1]))", after=at),
        Rule(arg, f"{value} in {allowed!r}", f"one of {list(allowed)}", actual=value, after=at),
    )  # fmt: skip


def sf_rules(n: str, label: str, rows: str, cols: str, layout: str, kind: str) -> tuple:
    """The rules of a scale-factor tensor `n` of grid (rows, cols) (cols counted in the kind's elements): `layout` an
    expression of the layout wanted, or "" for the one found (TileKernels' rule: a unit token stride with a non-unit
    channel stride is column-major). Binds <n>_layout and <n>_stride (the kernels' row stride, bytes when packed)."""
    s, lay, strides = f"s_{n}", f"{n}_layout", f"f'strides {{s_{n}}}'"
    found = f"('col' if {s}[0] == 1 and {s}[1] != 1 else 'row')"
    rules = [Rule(label, f"tuple(h_{n}) == ({rows}, {cols})", f"of shape {{({rows}, {cols})}}", actual=f"tuple(h_{n})", after=n)]
    if layout:
        rules.append(Rule(label, f"{rows} <= 1 or {cols} <= 1 or {found} == {layout}",
                          "{'column-major (stride (1, >= num_tokens))' if " + layout + " == 'col' else 'row-major (stride (>= cols, 1))'}",
                          actual=strides, after=n))  # fmt: skip
    return (
        *rules,
        Let(lay, layout or found, after=n),
        Rule(label, f"{rows} <= 1 or {cols} <= 1 or ({s}[1] == 1 and {s}[0] >= {cols} if {lay} == 'row'"
                    f" else {s}[0] == 1 and {s}[1] >= {rows})",
             "{'row-major with unit channel stride' if " + lay + " == 'row' else 'column-major with unit token stride'}",
             actual=strides, after=n),
        Rule(label, f"max({s}) * 4 <= _MAX_I32", "strided below 2**29 elements", actual=strides, after=n),
        Let(f"{n}_stride", f"({s}[0] if {lay} == 'row' else {s}[1]) * (4 if {kind} == 'ue8m0' else 1)", after=n),
    )  # fmt: skip


PAIR = {"x": ("x_data", "x_sf")}  # the unpack of a signature whose input is pair_input's


def pair_input(block_rules_: tuple, data_dtypes: tuple = (_F8, _I8), contiguous: bool = False, sf_dtypes=(_F32, _F8, _I32)):
    """A pre-quantized input x, the (data, sf) pair a signature unpacks (unpack=PAIR): data x[0] of
    data_dtypes (E2M1 int8: two codes a byte) in 16-byte aligned rows (or contiguous), then block_rules_ (placed after
    x_data, binding the scale block as `block`), then sf x[1] of sf_dtypes, one per block, row- or column-major as
    found; rows 1 to MAX_CAST_HIDDEN channels wide. Returns (tensors, rules); binds num_tokens, hidden (logical), in_kind,
    in_dtype, in_block, in_sf, x_sf_stride."""
    packed = _I8 in data_dtypes
    data = Tensor("x_data", data_dtypes, (("num_tokens", "data_cols"),), layout="contiguous" if contiguous else "rows",
                  align=16 if contiguous else 1, what="2-D (num_tokens, hidden)", label="x[0]")  # fmt: skip
    sf = Tensor("x_sf", sf_dtypes, None, layout="any", label="x[1]")
    rules = (
        Let("hidden", "2 * data_cols if t_x_data is _dt_int8 else data_cols" if packed else "data_cols", after="x_data.shape"),
        width_rule("x[0]", "x_data.shape"),
        *block_rules_,
        Rule("x[0]", "hidden % block[1] == 0", "a multiple of {block[1]} channels wide (x_block_size={block})",
             actual="f'{hidden} channels'", after="x_sf"),
        Let("in_kind", "'fp32' if t_x_sf is _dt_float32 else 'ue8m0' if t_x_sf is _dt_int32 else 'e4m3'", after="x_sf"),
        Let("sf_rows", "-(-num_tokens // block[0])", after="x_sf"),
        Let("in_cols", "-(-(hidden // block[1]) // 4) if in_kind == 'ue8m0' else hidden // block[1]", after="x_sf"),
        *sf_rules("x_sf", "x[1]", "sf_rows", "in_cols", "", "in_kind"),
        Let("in_dtype", "'e2m1' if t_x_data is _dt_int8 else 'e4m3'" if packed else "'e4m3'", after="x_sf"),
        Let("in_block", "f'{block[0]}x{block[1]}'", after="x_sf"),
        Let("in_sf", "in_kind + ('_col' if x_sf_layout == 'col' else '')", after="x_sf"),
    )  # fmt: skip
    return (data, sf), rules


# A cast mode's buffers from the caller: the name and label of the sf it writes ("cast", "sf_only") or reads
# ("precomputed_sf"), and the name and label of the data it writes. A cast's out=(data, sf) pair is unpacked into
# its two tensors (OUT_PAIR), so that anything else given as out is refused by name.
_GIVEN = {
    "cast": ("sf", "out[1]", "data", "out[0]"),
    "sf_only": ("out_sf", "out_sf", "", ""),
    "precomputed_sf": ("sf", "sf", "out_x", "out"),
    "round_trip": ("", "", "", ""),
}
OUT_PAIR = {"out": ("data", "sf")}  # the unpack of the "cast" mode's out


def given_buffers(mode: str, sf_rows: str, at: str, packed_rows: bool) -> tuple[tuple, tuple]:
    """The caller's tensors of a cast mode, after the input (rules placed at `at`): an sf of grid (sf_rows, sf_cols),
    dtype sf_dtype and layout `layout` (row-major and unpacked when it is read), and data (num_tokens, out_cols) of
    out_dtype, its rows packed (packed_rows: the per-token kernels' rule, any stride for one row) or contiguous.
    Returns (tensors, rules); binds sf_stride (give it a default of 0: no sf given)."""
    sf, label, data, data_label = _GIVEN[mode]
    tensors, rules = [], []
    if mode == "precomputed_sf":
        rules.append(Rule("sf", "layout == 'row' and kind != 'ue8m0'",
                          "row-major and unpacked (use_tma_aligned_col_major_sf and use_packed_ue8m0 False)",
                          actual="f'layout {layout}, kind {kind}'", after=at))  # fmt: skip
    if sf:
        tensors.append(Tensor(sf, None, None, layout="any", optional=mode != "precomputed_sf", label=label))
        rules += [
            Rule(label, f"t_{sf} is sf_dtype", "{sf_dtype} (sf kind {kind})", actual=f"t_{sf}", after=sf),
            *sf_rules(sf, label, sf_rows, "sf_cols", "'row'" if mode == "precomputed_sf" else "layout", "kind"),
            Let("sf_stride", f"{sf}_stride", after=sf),
        ]
    if data:
        layout = {"layout": "rows"} if packed_rows else {"layout": "contiguous", "align": 16}
        tensors.append(Tensor(data, (_F8, _I8), (("num_tokens", "out_cols"),), optional=True, label=data_label, **layout))
        rules.append(Rule(data_label, f"t_{data} is out_dtype", "{out_dtype}", actual=f"t_{data}", after=data))
        if packed_rows:
            rules.append(Rule(data_label, f"num_tokens <= 1 or s_{data}[0] == out_cols", "contiguous of shape {(num_tokens, out_cols)}",
                              actual=f"f'strides {{s_{data}}}'", after=data))  # fmt: skip
    return tuple(tensors), tuple(rules)


# ---- tracing (tkaot/_compile.py): what the casts allocate, through a fake's `new`


def new_sf(new, m_blocks: int, k_blocks: int, kind: str, col_major: bool, device):
    """_alloc_sf's tensor, allocated through `new`."""
    dtype, cols = _SF_DTYPE[kind], _sf_cols(k_blocks, kind)
    if not col_major:
        return new.empty((m_blocks, cols), dtype, device)
    return new.empty_strided((m_blocks, cols), (1, max(_align(m_blocks, 16 // _SF_ITEM_BYTES[kind]), 1)), dtype, device)


def sf_kind(round_sf: bool, use_packed_ue8m0: bool, use_e4m3_sf: bool = False) -> str:
    return "ue8m0" if use_packed_ue8m0 else "pow2" if round_sf else "e4m3" if use_e4m3_sf else "fp32"


def input_rows(x) -> tuple:
    """(num_tokens, hidden, device) of a bf16/fp32 x or of a (data, sf) pair (E2M1 int8 data: two channels a byte)."""
    if isinstance(x, torch.Tensor):
        return x.shape[0], x.shape[1], x.device
    data = x[0]
    return data.shape[0], data.shape[1] * (2 if data.dtype == _I8 else 1), data.device
