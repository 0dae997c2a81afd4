"""The generic per-token cast: per_token_cast with the row width `hidden` a runtime value.

It serves the calls whose specialised per_token_cast variant is not built, and writes the
same bytes: a thread's vectors are cast by the same code (per_token_vectors.cast_vectors),
and the vectors are the same (their width depends on the dtypes, the group and the input
block, never on hidden). Only which thread holds which vectors differs, and nothing depends
on the order of a reduction (a maximum).

The group and the sf layout are runtime values too (RUNTIME_AXES: the variants that differ only in
them share one cubin, each manifest entry fixing its values): the vectors are as wide as for the
narrowest group (the same width for every unquantized input), the lanes sharing a group and the
shuffles among them follow the runtime group, and the scale factors go to either layout's place.

The tiling does not depend on hidden: a CTA of 128 threads holds two row slots of
SEG_THREADS threads; each thread takes one vector of a row segment for ROWS tokens spaced
two apart. The grid's x runs along the row segments (consecutive CTAs cover one band of
rows, as a flat copy would) and y, then z, down the token blocks, so no thread divides by
a runtime value. A row's last segment may reach past its end: those threads load zeros,
join the shuffles and store nothing. Segments start on group boundaries, and hidden is a
multiple of 64, not always of the group: a row may end inside a group (a 128-channel group
of 64 channels), whose lanes past the end then add zeros to its amax, which is so the amax
of its channels in the row; its scale factor is stored wherever the group starts in the
row, by whichever lane forms it. The specialised kernel takes whole groups only
(PER_TOKEN_CAST.specialisable), so such rows are this kernel's alone.
"""

import math

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from kernels_src.quant import common, fp4_words
from kernels_src.quant.per_token_cast import check_static
from kernels_src.quant.per_token_vectors import GROUPS, VectorCast, cast_vectors, fp4_words_fit, vector_elems
from kernels_src.quant.segments import ROWS, SLOTS, THREADS, segment_dims, segment_grid, segment_place
from tkaot._quant.kernels import PER_TOKEN_CAST_GENERIC

DECL = PER_TOKEN_CAST_GENERIC  # the declaration this module builds (tkaot/_quant/kernels.py)

# Taken at run time, so the default set's 458 variants of this kernel are 78 cubins
RUNTIME_AXES = ("group", "sf_layout")
# A scale factor's place depends on the runtime layout, which no bound the compiler can prove holds: TileLang's guard
# around each such store is left out (each store is under the kernel's own token and row guards)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def build(in_dtype, in_block, in_sf, fmt, sf, mode, stochastic):
    # The specialised kernel's combination rules, at the narrowest row they allow (row-major scale factors: the modes
    # that take only those are built for them)
    bk = common.block_shape(in_block)[1] if in_dtype in ("e4m3", "e2m1") else max(GROUPS)
    check_static(math.lcm(64, max(GROUPS), bk), in_dtype, in_block, in_sf, fmt, max(GROUPS), sf, "row", mode, stochastic)
    vec = vector_elems(in_dtype, in_block, min(GROUPS))  # within the narrowest group
    group, sf_layout = T.dynamic("group"), T.dynamic("sf_layout")

    num_tokens, hidden, x_stride, sf_stride = segment_dims()
    in_sf_stride = T.dynamic("in_sf_stride")
    # As the specialised e2m1 tilings do, lane i of a group forms the scale factor of the group's vector i
    c = VectorCast(
        in_dtype=in_dtype, in_block=in_block, in_sf=in_sf, fmt=fmt, group=group, sf=sf, sf_layout=sf_layout, mode=mode,
        stochastic=stochastic, hidden=hidden, vec=vec, count=ROWS, one_scale=fmt == "e2m1",
        fp4_helpers=fp4_words_fit(in_dtype, fmt, vec, mode, stochastic),
    )  # fmt: skip
    grid = segment_grid(num_tokens, hidden, vec)
    bm = c.block[0]
    in_sf_rows = num_tokens if bm == 1 else T.ceildiv(num_tokens, bm)

    def placed(first_row, col, in_row):
        """Where the thread's vector u lies (token first_row + u * SLOTS, column col), and whether it is read and written."""
        return (lambda u: (first_row + u * SLOTS, col)), (lambda token: T.And(token < num_tokens, in_row))

    @T.prim_func
    def per_token_cast_generic(
        # Packed E2M1 rows are declared `hidden` bytes wide, twice their width: a dim must stand alone in some
        # extent to be bound, and nothing reads x's extent (addresses go by x_stride, every access is in the row)
        x: T.StridedTensor[(num_tokens, hidden), (x_stride, 1), c.storage],
        x_sf: T.StridedTensor[c.sf_in.shape(in_sf_rows), (in_sf_stride, 1), c.sf_in.dtype],
        out: T.Tensor[(num_tokens, c.out_cols), c.out_storage],
        out_sf: T.StridedTensor[c.sf_out.shape(num_tokens), c.sf_out.strides(sf_stride), c.sf_out.dtype],
    ):
        with T.Kernel(*grid, threads=THREADS) as (bx, by, bz):
            kernel_entry(fp4_words.DEVICE_HELPERS if c.fp4_helpers else "")  # kernels_src/pdl.py: before any memory access
            T.assume(x_stride % (16 // c.storage_bytes) == 0)
            tid = T.get_thread_binding()
            T.assume(hidden % 64 == 0)  # as declared (per_token_cast's hidden axis): the output rows vectorize
            lanes = T.alloc_var("int32")
            lanes = c.lanes
            shift = T.alloc_var("int32")
            shift = c.group_shift
            groups = T.alloc_var("int32")
            groups = c.num_groups
            m_step, k_step = T.alloc_var("int32"), T.alloc_var("int32")
            m_step, k_step = c.sf_out.steps(sf_layout, sf_stride)
            held = c.in_kernel(lanes, shift, groups, (m_step, k_step))
            first_row, col = segment_place(bx, by, bz, tid, vec)
            in_row = col + vec <= hidden  # the vector is in the row: all of it, or none (hidden is a multiple of vec)
            group_in_row = col - held.lane_in_group(tid) * vec < hidden  # the group starts in the row (it may end past it)
            at, in_range = placed(first_row, col, in_row)
            group_in_range = lambda token: T.And(token < num_tokens, group_in_row)  # noqa: E731
            cast_vectors(held, x, x_sf, out, out_sf, tid, at, in_range, group_in_range)

    return per_token_cast_generic
