"""Argument checks and scale-factor layouts shared by tkaot.quant's cast ops (no op lives here).

Formats: "e4m3" data is torch.float8_e4m3fn; "e2m1" data is torch.int8 holding two
FP4 codes a byte. Scale-factor kinds: "fp32", "pow2" (fp32 powers of two), "ue8m0"
(exponent bytes packed four to an int32) and "e4m3"; layouts "row" and "col"
(column-major with the token stride padded to 16 bytes, DeepGEMM's layout). Every
check raises ValueError/TypeError naming the argument, before anything is launched.
"""

from __future__ import annotations

import torch

from tkaot._validate import MAX_I32, Let, Rule, Tensor, check_cuda, fail

_FMT_DTYPE = {"e4m3": torch.float8_e4m3fn, "e2m1": torch.int8}
_IN_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float8_e4m3fn: "e4m3", torch.int8: "e2m1"}
_SF_DTYPE = {"fp32": torch.float32, "pow2": torch.float32, "ue8m0": torch.int32, "e4m3": torch.float8_e4m3fn}
_IN_BLOCKS = ((1, 16), (1, 32), (1, 64), (1, 128), (32, 32), (128, 128))
_SF_ITEM_BYTES = {"fp32": 4, "pow2": 4, "ue8m0": 4, "e4m3": 1}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _align(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


# The sf-kind rule, the one place it lives: packed UE8M0 holds powers of two, so it needs round_sf; the kind
# the options ask for. The fused ops' Signatures check it inline (as data); _sf_kind applies it for the casts.
SF_PACKED_RULE = Rule(
    "use_packed_ue8m0", "round_sf or not use_packed_ue8m0", "used with round_sf=True (UE8M0 holds powers of two only)",
    actual="'round_sf=False'",
)  # fmt: skip
SF_KIND = Let("sf_kind", "'ue8m0' if use_packed_ue8m0 else 'pow2' if round_sf else 'fp32'")


def _sf_kind(op: str, round_sf: bool, use_packed_ue8m0: bool, use_e4m3_sf: bool = False) -> str:
    """SF_PACKED_RULE and SF_KIND, and the e4m3 sf the casts also offer."""
    if use_packed_ue8m0 and not round_sf:
        fail(op, SF_PACKED_RULE.name, SF_PACKED_RULE.expected, "round_sf=False")
    if round_sf and use_e4m3_sf:
        fail(op, "use_e4m3_sf", "False when round_sf=True", "both True")
    if use_packed_ue8m0:
        return "ue8m0"
    if round_sf:
        return "pow2"
    return "e4m3" if use_e4m3_sf else "fp32"


def _check_fmt(op: str, fmt) -> None:
    if fmt not in _FMT_DTYPE:
        fail(op, "fmt", "'e4m3' or 'e2m1'", repr(fmt))


def _check_block(op: str, name: str, block, allowed) -> tuple[int, int]:
    if not (isinstance(block, (tuple, list)) and len(block) == 2 and all(isinstance(b, int) for b in block)):
        fail(op, name, "a pair of ints", repr(block))
    block = (int(block[0]), int(block[1]))
    if block not in allowed:
        fail(op, name, f"one of {list(allowed)}", block)
    return block


def _check_data(op: str, name: str, t, dtypes: tuple, device: int | None = None) -> int:
    """A 2-D tensor of one of `dtypes`, last dim contiguous, rows 16-byte aligned; returns its device."""
    device = check_cuda(op, name, t, device)
    if t.dtype not in dtypes:
        fail(op, name, " or ".join(str(d) for d in dtypes), t.dtype)
    if t.dim() != 2:
        fail(op, name, "2-D (num_tokens, hidden)", f"shape {tuple(t.shape)}")
    if t.stride(1) != 1 and t.shape[1] > 1:
        fail(op, name, "contiguous in its last dimension", f"strides {t.stride()}")
    per_row = 16 // t.element_size()
    if t.data_ptr() % 16 or (t.shape[0] > 1 and (t.stride(0) % per_row or t.stride(0) > MAX_I32)):
        fail(
            op,
            name,
            f"16-byte aligned, with a row stride a multiple of {per_row} elements",
            f"address {t.data_ptr():#x}, strides {t.stride()}",
        )
    return device


def _sf_cols(k_blocks: int, kind: str) -> int:
    return _ceil_div(k_blocks, 4) if kind == "ue8m0" else k_blocks


def _sf_layout_of(t: torch.Tensor) -> str:
    """TileKernels' rule: a scale-factor tensor with unit token stride and a non-unit channel stride is column-major."""
    return "col" if t.stride(0) == 1 and t.stride(1) != 1 else "row"


def _sf_kernel_stride(t: torch.Tensor, kind: str, layout: str) -> int:
    """The sf buffer's row stride as the kernel addresses it (bytes for packed UE8M0)."""
    stride = t.stride(0) if layout == "row" else t.stride(1)
    return stride * 4 if kind == "ue8m0" else stride


def _check_sf(op: str, name: str, t, device: int, m_blocks: int, k_blocks: int, kind: str, layout: str | None) -> str:
    """A scale-factor tensor of the given kind and logical grid; returns its layout ("row"/"col")."""
    check_cuda(op, name, t, device)
    if t.dtype != _SF_DTYPE[kind]:
        fail(op, name, f"{_SF_DTYPE[kind]} (sf kind {kind})", t.dtype)
    shape = (m_blocks, _sf_cols(k_blocks, kind))
    if tuple(t.shape) != shape:
        fail(op, name, f"of shape {shape}", tuple(t.shape))
    found = _sf_layout_of(t) if t.dim() == 2 else "row"
    if layout is not None and m_blocks > 1 and shape[1] > 1 and found != layout:
        want = "column-major (stride (1, >= num_tokens))" if layout == "col" else "row-major (stride (>= cols, 1))"
        fail(op, name, want, f"strides {t.stride()}")
    layout = layout or found
    if m_blocks > 1 and shape[1] > 1:
        if layout == "row" and (t.stride(1) != 1 or t.stride(0) < shape[1]):
            fail(op, name, "row-major with unit channel stride", f"strides {t.stride()}")
        if layout == "col" and (t.stride(0) != 1 or t.stride(1) < m_blocks):
            fail(op, name, "column-major with unit token stride", f"strides {t.stride()}")
    if max(t.stride()) * 4 > MAX_I32:
        fail(op, name, "strided below 2**29 elements", f"strides {t.stride()}")
    return layout


def _alloc_sf(m_blocks: int, k_blocks: int, kind: str, layout: str, device) -> torch.Tensor:
    """A new sf tensor; column-major ones pad the token stride to 16 bytes (TMA alignment)."""
    dtype, cols = _SF_DTYPE[kind], _sf_cols(k_blocks, kind)
    if layout == "row":
        return torch.empty((m_blocks, cols), dtype=dtype, device=device)
    pitch = max(_align(m_blocks, 16 // _SF_ITEM_BYTES[kind]), 1)
    storage = torch.empty((cols, pitch), dtype=dtype, device=device)
    return storage.as_strided((m_blocks, cols), (1, pitch))


def _sf_flags(t: torch.Tensor) -> str:
    return {torch.float32: "fp32", torch.int32: "ue8m0", torch.float8_e4m3fn: "e4m3"}.get(t.dtype, "")


def _check_given_outputs(op, mode, sf, out_sf, out_x, device, sf_blocks, kind, layout, out_dtype, out_shape, rows_packed):
    """Check a precomputed sf and the caller's output buffers; returns the sf tensor to write (None: allocate one)."""
    if mode == "precomputed_sf":
        if layout == "col" or kind == "ue8m0":
            fail(
                op,
                "sf",
                "row-major and unpacked (use_tma_aligned_col_major_sf and use_packed_ue8m0 False)",
                f"layout {layout}, kind {kind}",
            )
        _check_sf(op, "sf", sf, device, *sf_blocks, kind, "row")
        out_sf = sf
    elif out_sf is not None:
        _check_sf(op, "out_sf" if mode == "sf_only" else "out[1]", out_sf, device, *sf_blocks, kind, layout)
    if mode != "sf_only" and out_x is not None:
        name = "out" if mode == "precomputed_sf" else "out[0]"
        _check_data(op, name, out_x, (out_dtype,), device)
        if tuple(out_x.shape) != out_shape or not rows_packed(out_x):
            fail(op, name, f"contiguous of shape {out_shape}", f"shape {tuple(out_x.shape)}, strides {out_x.stride()}")
    return out_sf


def _quantized_input(op: str, x, x_block_size):
    """(device, data, sf, in_dtype name, block, in_sf axis value, logical hidden) of a pre-quantized (x, sf) pair."""
    if not (isinstance(x, (tuple, list)) and len(x) == 2):
        raise TypeError(f"{op}: x must be a tensor or a (data, sf) pair, got {type(x).__name__}")
    data, sf = x
    device = _check_data(op, "x[0]", data, (torch.float8_e4m3fn, torch.int8))
    if x_block_size is None:
        fail(op, "x_block_size", "given for a pre-quantized (data, sf) input", None)
    block = _check_block(op, "x_block_size", x_block_size, _IN_BLOCKS)
    check_cuda(op, "x[1]", sf, device)
    kind = _sf_flags(sf)
    if not kind or sf.dim() != 2:
        fail(op, "x[1]", "a 2-D float32, float8_e4m3fn or int32 (packed UE8M0) tensor", f"{sf.dtype} of shape {tuple(sf.shape)}")
    tokens, hidden = data.shape[0], data.shape[1] * (2 if data.dtype == torch.int8 else 1)
    if hidden % block[1]:
        fail(op, "x[0]", f"a multiple of {block[1]} channels wide (x_block_size={block})", f"{hidden} channels")
    layout = _check_sf(op, "x[1]", sf, device, _ceil_div(tokens, block[0]), hidden // block[1], kind, None)
    in_sf = kind + ("_col" if layout == "col" else "")
    return device, data, sf, _IN_NAMES[data.dtype], block, in_sf, hidden, layout, kind


def _check_contiguous_input(op: str, x) -> int:
    device = _check_data(op, "x", x, (torch.bfloat16, torch.float32))
    if not x.is_contiguous():
        fail(op, "x", "contiguous", f"strides {x.stride()}")
    return device


# ---- declared pieces: the input rules the casts share, as tkaot._validate data ------------------------------------
# Each piece says what the hand checks above say, in the same words, so an op declared from them raises what it did.

_F8 = torch.float8_e4m3fn
_STRIDES = "f'strides {{s_{n}}}'"


def data_tensor(n: str, label: str, dtypes, optional: bool = False) -> tuple:
    """A (rows, cols) tensor whose rows are 16-byte aligned vectors (_check_data's rules), and its rules; dtypes a tuple,
    or the name of a bound value holding the one dtype allowed."""
    bound = isinstance(dtypes, str)
    tensor = Tensor(n, None if bound else dtypes, None, layout="any", optional=optional, label=label)
    strides = _STRIDES.format(n=n)
    rules = (
        *((Rule(label, f"t_{n} is {dtypes}", f"{{{dtypes}}}", actual=f"t_{n}", after=n),) if bound else ()),
        Rule(label, f"len(h_{n}) == 2", "2-D (num_tokens, hidden)", actual=f"f'shape {{tuple(h_{n})}}'", after=n),
        Rule(label, f"s_{n}[1] == 1 or h_{n}[1] <= 1", "contiguous in its last dimension", actual=strides, after=n),
        Let(f"{n}_vec", f"16 // t_{n}.itemsize", after=n),
        Rule(label, f"not (p_{n} % 16 or (h_{n}[0] > 1 and (s_{n}[0] % {n}_vec or s_{n}[0] > _MAX_I32)))",
             f"16-byte aligned, with a row stride a multiple of {{{n}_vec}} elements",
             actual=f"f'address {{p_{n}:#x}}, strides {{s_{n}}}'", after=n),
    )  # fmt: skip
    return tensor, rules


def fmt_rule(at: str) -> Rule:
    return Rule("fmt", "fmt == 'e4m3' or fmt == 'e2m1'", "'e4m3' or 'e2m1'", actual="repr(fmt)", after=at)


def sf_kind_rules(at: str) -> tuple:
    """_sf_kind's rules; binds kind."""
    return (
        Rule("use_packed_ue8m0", "round_sf or not use_packed_ue8m0", SF_PACKED_RULE.expected, actual="'round_sf=False'", after=at),
        Rule("use_e4m3_sf", "not (round_sf and use_e4m3_sf)", "False when round_sf=True", actual="'both True'", after=at),
        Let("kind", "'ue8m0' if use_packed_ue8m0 else 'pow2' if round_sf else 'e4m3' if use_e4m3_sf else 'fp32'", after=at),
    )


def block_rules(arg: str, value: str, allowed: tuple, at: str, given: bool = False) -> tuple:
    """`arg` is a pair of ints among `allowed` (_check_block; given: not None, for a pre-quantized input), bound as `value`."""
    rules = (Rule(arg, f"{arg} is not None", "given for a pre-quantized (data, sf) input", actual="None", after=at),) if given else ()
    return (
        *rules,
        Rule(arg, f"isinstance({arg}, (tuple, list)) and len({arg}) == 2 and all(isinstance(b, int) for b in {arg})",
             "a pair of ints", actual=f"repr({arg})", after=at),
        Let(value, f"(int({arg}[0]), int({arg}[1]))", after=at),
        Rule(arg, f"{value} in {allowed!r}", f"one of {list(allowed)}", actual=value, after=at),
    )  # fmt: skip


def sf_tensor(n: str, label: str, optional: bool = True) -> Tensor:
    """A caller's scale-factor tensor of sf_dtype (a bound value, checked by sf_dtype_rule); its shape and layout are sf_rules'."""
    return Tensor(n, None, None, layout="any", optional=optional, label=label)


def sf_dtype_rule(n: str, label: str) -> Rule:
    return Rule(label, f"t_{n} is sf_dtype", "{sf_dtype} (sf kind {kind})", actual=f"t_{n}", after=n)


def sf_rules(n: str, label: str, rows: str, cols: str, layout: str, kind: str) -> tuple:
    """_check_sf's rules for a scale-factor tensor `n` of logical grid (rows, cols) (cols counted in the kind's
    elements), `layout` an expression of the layout wanted, or "" for the one found (TileKernels' rule: unit token
    stride and a non-unit channel stride is column-major). Binds <n>_layout and <n>_stride (the kernel's row stride)."""
    s, lay = f"s_{n}", f"{n}_layout"
    found = f"('col' if len({s}) == 2 and {s}[0] == 1 and {s}[1] != 1 else 'row')"
    strides = _STRIDES.format(n=n)
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


_SF_KIND_OF = "('fp32' if t_x_sf is torch.float32 else 'ue8m0' if t_x_sf is torch.int32 else 'e4m3')"


def pair_tensors(block: str = "block", block_rules_: tuple = ()) -> tuple:
    """A pre-quantized input's data ("x[0]") and sf ("x[1]") (_quantized_input's rules, block_rules_ between them, which
    bind `block`): binds num_tokens, hidden (logical), in_kind, x_sf_layout, x_sf_stride, in_dtype, in_block and in_sf."""
    data, data_rules = data_tensor("x_data", "x[0]", (_F8, torch.int8))
    sf = Tensor("x_sf", None, None, layout="any", label="x[1]")
    rules = (
        *data_rules,
        *block_rules_,
        Rule("x[1]", f"len(h_x_sf) == 2 and t_x_sf in {(torch.float32, _F8, torch.int32)!r}",
             "a 2-D float32, float8_e4m3fn or int32 (packed UE8M0) tensor", actual="f'{t_x_sf} of shape {tuple(h_x_sf)}'",
             after="x_sf"),
        Let("num_tokens", "h_x_data[0]", after="x_sf"),
        Let("hidden", "2 * h_x_data[1] if t_x_data is torch.int8 else h_x_data[1]", after="x_sf"),
        Rule("x[0]", f"hidden % {block}[1] == 0", f"a multiple of {{{block}[1]}} channels wide (x_block_size={{{block}}})",
             actual="f'{hidden} channels'", after="x_sf"),
        Let("in_kind", _SF_KIND_OF, after="x_sf"),
        Let("sf_rows", f"-(-num_tokens // {block}[0])", after="x_sf"),
        Let("in_cols", f"-(-(hidden // {block}[1]) // 4) if in_kind == 'ue8m0' else hidden // {block}[1]", after="x_sf"),
        *sf_rules("x_sf", "x[1]", "sf_rows", "in_cols", "", "in_kind"),
        Let("in_dtype", "'e2m1' if t_x_data is torch.int8 else 'e4m3'", after="x_sf"),
        Let("in_block", f"f'{{{block}[0]}}x{{{block}[1]}}'", after="x_sf"),
        Let("in_sf", "in_kind + ('_col' if x_sf_layout == 'col' else '')", after="x_sf"),
    )  # fmt: skip
    return (data, sf), rules


def pair(op: str, x) -> tuple:
    """The (data, sf) of a pre-quantized input."""
    if not (isinstance(x, (tuple, list)) and len(x) == 2):
        raise TypeError(f"{op}: x must be a tensor or a (data, sf) pair, got {type(x).__name__}")
    return x
