"""Per-token cast to FP8 E4M3 or FP4 E2M1 for Ascend: one scale factor per `group` columns of a row.

A block takes `rows` tokens by one segment of `width` columns (the whole row where it fits the Unified
Buffer) into the Unified Buffer. In a SIMT region threads are dealt (row, group) pairs: each finds its group's
largest magnitude and forms the scale factor and its inverse with the CUDA kernels' expressions
(kernels_src/quant/common.py), then every element is scaled by its group's inverse and rounded (E2M1 codes
two a byte, the lower-indexed element in the low nibble, the bytes the CUDA kernel's words hold). Scale
factors go straight from the SIMT region to their place in out_sf, so every layout the declaration has (fp32,
pow2, E4M3, packed UE8M0 with its unused bytes zeroed; row- or column-major) is one store.

Modes as on CUDA (kernels_src/quant/per_token_cast.py): "cast" writes values and scale factors, "sf_only" only
the scale factors, "precomputed_sf" reads the scale factors and writes the values, "round_trip" overwrites the
input with its quantized-then-dequantized value. Quantized inputs (E4M3, packed E2M1) are decoded as data *
x_sf in fp32 first (their scale factors read per input block); stochastic rounding takes its bits from the
CUDA kernels' hash of (element index, value).
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import split_block, whole_row_build
from kernels_src.ascend.quant_in import BYTES, STORAGE, RuntimeSfLayout, decode
from kernels_src.ascend.tile import rows_per_block, segment
from kernels_src.quant import common
from tkaot._quant.kernels import PER_TOKEN_CAST

DECL = PER_TOKEN_CAST
REQUIRES: dict[str, int] = {}
THREADS = 128
MIN_GROUP = 16  # the narrowest group: a generic kernel's inverses are kept a 16-column cell each


def unsupported(hidden, in_dtype, in_block, in_sf, fmt, group, sf, sf_layout, mode, stochastic) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    if hidden % group:
        return f"hidden={hidden} is not a multiple of group={group}"
    return None


def per_token_cast_kernel(hidden, width, in_dtype, in_block, in_sf, fmt, group, sf, sf_layout, mode, stochastic):
    """The kernel for rows of `hidden` columns: an int (whole groups), cut into the widest segments that divide it
    (width None), or the generic kernel's runtime value, cut into segments of `width` (the last clipped to the row,
    where a row may end inside a group: its columns past the end take no part). The generic kernel may also take
    the group and the sf layout (0 row, 1 col) at run time: tiles sized for the narrowest group, each group's
    inverse kept in the 16-column cells it covers, scale factors placed by the runtime layout."""
    generic = width is not None
    runtime_group = not isinstance(group, int)
    sizing_group = MIN_GROUP if runtime_group else group  # the group the tiles are sized for
    storage, per = STORAGE[in_dtype]
    quantized_in = in_dtype in ("e4m3", "e2m1")
    bm, bk = common.block_shape(in_block) if quantized_in else (1, sizing_group)
    fp4 = fmt == "e2m1"
    writes_values = mode in ("cast", "precomputed_sf")
    # a runtime group's round trip writes its values beside the input (threads' groups then disjoint by buffer, not
    # by an index TileLang's barrier analysis cannot bound)
    separate_back = runtime_group and mode == "round_trip"
    col_bytes = BYTES[storage] / per * (2 if separate_back else 1) + (0.5 if fp4 else 1) * writes_values + 4 / sizing_group + 4 / bk
    if generic:
        segs = T.ceildiv(hidden, width)
        num_groups = T.ceildiv(hidden, group)  # the last may be partial
    else:
        width = segment(hidden, max(group, bk), col_bytes)
        segs = hidden // width
        num_groups = hidden // group
    rows = rows_per_block(int(width * col_bytes) + 1, 1)
    groups = width // group  # a segment's groups
    slots = width // sizing_group  # a tile row's inverses (of a runtime group: its 16-column cells)
    hidden_u32 = T.Cast("uint32", hidden) if generic else T.uint32(hidden)
    # packed E2M1 rows of a runtime width are declared `hidden` bytes wide, twice their width: a dim must stand
    # alone in some extent to be bound (addresses go by x_stride, every access is in the row)
    x_cols = hidden if generic and per > 1 else hidden // per
    num_tokens = T.dynamic("num_tokens")
    x_stride, sf_stride, in_sf_stride = T.dynamic("x_stride"), T.dynamic("sf_stride"), T.dynamic("in_sf_stride")
    if isinstance(sf_layout, str):
        sf_out = common.SfLayout(sf, sf_layout, num_groups)
        sf_shape, sf_strides = sf_out.shape(num_tokens), (sf_stride, 1)
    else:  # the leading extents bind the runtime group, the strides the layout
        sf_out = RuntimeSfLayout(sf, sf_layout, num_groups, (group, 1))
        sf_shape, sf_strides = sf_out.shape(num_tokens), sf_out.strides(sf_stride)
    sf_in = common.SfLayout.from_input(in_sf if quantized_in else "fp32", hidden // bk if quantized_in else 1)
    out_dtype, out_cols, out_width = ("uint8", hidden // 2, width // 2) if fp4 else ("float8_e4m3fn", hidden, width)
    if generic and fp4:
        out_cols = hidden  # declared twice as wide, as x is: hidden stands alone there
    inv_bf16 = in_dtype == "bfloat16" and sf in ("pow2", "ue8m0") and mode == "precomputed_sf"  # TileKernels' 1/sf in bf16

    in_sf_rows = num_tokens if bm == 1 else (num_tokens + bm - 1) // bm

    def quantize(v, index):
        # the fp32 value v, stochastically rounded where asked, as a value of fmt's grid (or an E4M3 number)
        if stochastic:
            rbits = common.hash_u32(index, common.f32_bits(v))
            v = common.with_sign_of(common.stochastic_round_magnitude(T.abs(v), rbits, fmt), v)
        return v

    def value(x_ub, scale_ub, inv_ub, i, c):
        # element c of row i times its factor (input scale times inverse, in that order)
        factor = scale_ub[i, c // bk] * inverse(inv_ub, i, c) if quantized_in else inverse(inv_ub, i, c)
        return decode(in_dtype, x_ub, i, c) * factor

    def scaled(x_ub, scale_ub, inv_ub, i, c, index):
        # that value, rounded where stochastic
        return quantize(value(x_ub, scale_ub, inv_ub, i, c), index + T.Cast("uint32", c))

    def code(x_ub, scale_ub, inv_ub, i, c, index):
        return common.e2m1_code(scaled(x_ub, scale_ub, inv_ub, i, c, index))

    def inverse(inv_ub, i, c):
        # the inverse scale factor of element c of row i (of a runtime group: of its 16-column cell)
        return inv_ub[i, c // MIN_GROUP] if runtime_group else inv_ub[i, c // group]

    @T.macro
    def set_inverse(inv_ub, i, g, inv):
        # group g's inverse into its slot (of a runtime group: into each 16-column cell it covers)
        if runtime_group:
            for e in T.serial(group // MIN_GROUP):
                inv_ub[i, (g * (group // MIN_GROUP) + e) % slots] = inv  # (the modulo bounds the index, changing none)
        else:
            inv_ub[i, g] = inv

    def pair_in_range(pair, row, col):
        # a (row, group) pair of the tile whose token exists (and, of a runtime width, whose group starts in the row)
        live = T.And(pair < rows * groups, row + pair // groups < num_tokens)
        return T.And(live, col + pair % groups * group < hidden) if generic else live

    def block_in_range(i, q, row, col):
        # input block q of the tile's row i exists (a runtime width: it starts in the row)
        return T.And(row + i < num_tokens, col + q * bk < hidden) if generic else row + i < num_tokens

    def in_segment(c):
        # a column of the tile's group (of a runtime group the modulo changes none: it bounds the index for
        # TileLang's barrier analysis, which then sees these accesses apart from the inverses')
        return c % width if runtime_group else c

    def group_in_range(i, g, row, col):
        # (runtime group) group g of the tile's row i: its token exists and the group starts in the segment and row
        return T.And(T.And(row + i < num_tokens, g < groups), col + g * group < hidden)

    @T.macro
    def group_pass(x_ub, back_ub, scale_ub, inv_ub, out_sf, amax, row, col, i, g):
        # group g of the tile's row i: its scale factor (or, precomputed, the one stored) and inverse, and in
        # round_trip mode its values overwritten in place
        token, gi = row + i, col // group + g
        if mode == "precomputed_sf":
            inv = T.float32(1.0) / common.decode_sf(out_sf[sf_out.index(token, gi)], sf)
            set_inverse(inv_ub, i, g, T.Cast("float32", T.Cast("bfloat16", inv)) if inv_bf16 else inv)
        else:
            amax[0] = T.float32(0)
            for j in T.serial(group):
                c = in_segment(g * group + j)
                mag = T.abs(decode(in_dtype, x_ub, i, c))
                if generic:  # a row may end inside the group
                    mag_in = T.if_then_else(col + c < hidden, mag * scale_ub[i, c // bk] if quantized_in else mag, 0)
                    amax[0] = T.max(amax[0], mag_in)
                else:
                    amax[0] = T.max(amax[0], mag * scale_ub[i, c // bk] if quantized_in else mag)
            stored, inv = common.scale_factor(amax[0], fmt, sf)
            set_inverse(inv_ub, i, g, inv)
            if mode == "round_trip":
                # the group overwritten in place by its quantized-then-dequantized value
                for j in T.serial(group):
                    c = in_segment(g * group + j)
                    v = decode(in_dtype, x_ub, i, c) * inv
                    back = common.e2m1_value(common.e2m1_code(v)) if fp4 else T.Cast("float32", common.to_e4m3(v))
                    back_ub[i, c] = T.Cast(storage, back * common.decode_sf(stored, sf))
            else:
                out_sf[sf_out.index(token, gi)] = stored
                if generic and sf_out.packed:
                    if gi == num_groups - 1:
                        for p in T.serial(sf_out.pad):
                            out_sf[sf_out.index(token, num_groups + p)] = T.uint8(0)
                elif sf_out.pad and gi == num_groups - 1:
                    for p in T.serial(sf_out.pad):
                        out_sf[sf_out.index(token, num_groups + p)] = T.uint8(0)

    @T.prim_func
    def per_token_cast(
        x: T.StridedTensor[(num_tokens, x_cols), (x_stride, 1), storage],
        x_sf: T.StridedTensor[sf_in.shape(in_sf_rows), (in_sf_stride, 1), sf_in.dtype],
        out: T.Tensor[(num_tokens, out_cols), out_dtype],
        out_sf: T.StridedTensor[sf_shape, sf_strides, sf_out.dtype],
    ):
        if generic:
            T.assume(hidden > 0)  # as the op checks
        if runtime_group:
            T.assume(T.And(group >= MIN_GROUP, group <= width))
        tiles = T.ceildiv(num_tokens, rows)
        with T.Kernel(tiles * segs) as block:
            row, col = split_block(block, segs, width, rows)
            x_ub = T.alloc_shared((rows, width // per), storage)
            if separate_back:
                back_ub = T.alloc_shared((rows, width // per), storage)  # round_trip's values
            out_ub = T.alloc_shared((rows, out_width), out_dtype)
            inv_ub = T.alloc_shared((rows, slots), T.float32)
            scale_ub = T.alloc_shared((rows, width // bk), T.float32)  # input scales (quantized input)
            if generic:
                span = T.min(width, hidden - col)  # the segment's columns in the row
                T.copy(x[row : row + rows, col // per : col // per + span // per], x_ub[:, 0 : span // per])
            else:
                T.copy(x[row : row + rows, col // per : (col + width) // per], x_ub)
            with T.SimtVF(threads=THREADS):
                amax = T.alloc_local((1,), T.float32)  # each thread's running maximum
                if quantized_in:
                    for i, q in T.Parallel(rows, width // bk):
                        stored_in = x_sf[sf_in.index((row + i) // bm, col // bk + q)]
                        scale_ub[i, q] = T.if_then_else(
                            block_in_range(i, q, row, col), common.decode_sf(stored_in, sf_in.kind), T.float32(0)
                        )
                if runtime_group:
                    # each row's groups dealt round-robin to all threads (no division by the runtime group count)
                    for t in T.Parallel(THREADS):
                        for i in T.serial(rows):
                            for w in T.serial(T.ceildiv(groups, THREADS)):
                                if group_in_range(i, w * THREADS + t, row, col):
                                    group_pass(
                                        x_ub,
                                        back_ub if separate_back else x_ub,
                                        scale_ub,
                                        inv_ub,
                                        out_sf,
                                        amax,
                                        row,
                                        col,
                                        i,
                                        w * THREADS + t,
                                    )
                else:
                    # (row, group) pairs dealt round-robin to all threads: one uniform loop, no partial barrier
                    for t in T.Parallel(THREADS):
                        for w in T.serial(T.ceildiv(rows * groups, THREADS)):
                            pair = w * THREADS + t
                            # (a tile's rows past the last token: nothing read or stored)
                            if pair_in_range(pair, row, col):
                                i, g = pair // groups, pair % groups
                                group_pass(x_ub, x_ub, scale_ub, inv_ub, out_sf, amax, row, col, i, g)
                if writes_values:
                    for i, b in T.Parallel(rows, out_width):
                        index = T.Cast("uint32", row + i) * hidden_u32 + T.Cast("uint32", col)
                        if stochastic:
                            # each value, then its rounding, bound once: the rounding reads the value, and the code
                            # the rounded value, many times (written inline, the expression grows to tens of kB)
                            if fp4:
                                raw_low = value(x_ub, scale_ub, inv_ub, i, 2 * b)
                                raw_high = value(x_ub, scale_ub, inv_ub, i, 2 * b + 1)
                                q_low = quantize(raw_low, index + T.Cast("uint32", 2 * b))
                                q_high = quantize(raw_high, index + T.Cast("uint32", 2 * b + 1))
                                out_ub[i, b] = T.Cast("uint8", common.e2m1_code(q_low) | (common.e2m1_code(q_high) << T.uint32(4)))
                            else:
                                raw = value(x_ub, scale_ub, inv_ub, i, b)
                                rounded = quantize(raw, index + T.Cast("uint32", b))
                                out_ub[i, b] = common.to_e4m3(rounded)
                        elif fp4:
                            low = code(x_ub, scale_ub, inv_ub, i, 2 * b, index)
                            high = code(x_ub, scale_ub, inv_ub, i, 2 * b + 1, index)
                            out_ub[i, b] = T.Cast("uint8", low | (high << T.uint32(4)))
                        else:
                            out_ub[i, b] = common.to_e4m3(scaled(x_ub, scale_ub, inv_ub, i, b, index))
            if generic:
                if writes_values:
                    q = 2 if fp4 else 1
                    T.copy(out_ub[:, 0 : span // q], out[row : row + rows, col // q : col // q + span // q])
                if mode == "round_trip":
                    T.copy(back_ub[:, 0:span] if separate_back else x_ub[:, 0:span], x[row : row + rows, col : col + span])
            else:
                if writes_values:
                    T.copy(out_ub, out[row : row + rows, col // (2 if fp4 else 1) : (col + width) // (2 if fp4 else 1)])
                if mode == "round_trip":
                    T.copy(x_ub, x[row : row + rows, col : col + width])

    return per_token_cast


build = whole_row_build(DECL, unsupported, per_token_cast_kernel)
