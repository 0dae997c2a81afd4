"""The final Sinkhorn matrix: out[row] = x * alpha / (||x|| + eps), x = row_scale[row] * matrix[row] * col_scale.

head_dim is static (kernels_src/engram/sinkhorn_rows.py), rows are runtime. Tiling "r<rows>[c][p]" (round fin23):
- r1: one CTA a row, col_scale read from global (L2) with the row (the form shipped so far);
- r<R>c: R consecutive rows a CTA in turn, col_scale read once into registers (the row layout's);
- r<R>cp: as r<R>c, with the next row's matrix loads issued before this row's reduction, so that a CTA keeps 20 KB
  (at head_dim 5120) in flight while it reduces and stores;
- r<R>p: the next row prefetched, col_scale read from global with each row (40 registers fewer than r<R>cp);
- r<R>cs, r<R>s: the next row staged in shared memory by cp.async (16 bytes a copy, each thread the columns it holds),
  waited for at the row's start: the prefetch without its 40 registers;
- a trailing "w" (r1w, r4cw, ...): the output row written to shared memory in the row layout, then stored 16
  contiguous bytes a thread, so a warp's store covers whole 32-byte sectors (in the row layout a thread's 8 columns
  are 32 bytes, stored as two 16-byte halves by two instructions).
Every form computes x, its sum of squares (T.reduce_sum over the same 128-thread layout) and the output with the same
operations in the same order: the bytes are the same as r1's.
"""

import re

import tilelang.language as T

from kernels_src.engram.sinkhorn_rows import VEC, load_row, row_layout, sinkhorn_types, threads_for
from kernels_src.pdl import kernel_entry
from tkaot._engram.kernels import SINKHORN_FINALIZE

DECL = SINKHORN_FINALIZE  # the declaration this module builds (tkaot/_engram/kernels.py)


def parse_tiling(tiling: str) -> tuple[int, bool, str, bool]:
    """(rows a CTA, col_scale in registers, how the next row is prefetched: "p" registers, "s" shared memory, "";
    stores coalesced through shared memory)."""
    match = re.fullmatch(r"r(\d+)(c?)([ps]?)(w?)", tiling)
    if match is None or not 1 <= int(match[1]) <= 64 or (int(match[1]) > 1) != bool(match[2] or match[3]):
        raise ValueError(f"engram_sinkhorn_finalize tiling {tiling!r} is not r1[w] or r<rows>[c][p|s][w] (rows 2-64)")
    return int(match[1]), bool(match[2]), match[3], bool(match[4])


def build(head_dim: int, tiling: str = "r1"):
    rows_per_cta, cached, prefetch, coalesced = parse_tiling(tiling)
    threads = threads_for(head_dim)
    num_rows, matrices, per_row, per_col = sinkhorn_types(head_dim)

    @T.macro
    def store(out, row, x, factor, staged):
        """out[row] = x * factor: straight from the row layout (each warp store writes half of 32 sectors), or with
        "w" through shared memory, then 16 contiguous bytes a thread (each warp store writes 16 whole sectors)."""
        if coalesced:
            for col in T.Parallel(head_dim):
                staged[col] = x[col] * factor
            T.copy(staged, out[row, :], disable_tma=True)
        else:
            for col in T.Parallel(head_dim):
                out[row, col] = x[col] * factor

    if tiling == "r1":

        @T.prim_func
        def engram_sinkhorn_finalize(
            matrix: matrices, row_scale: per_row, col_scale: per_col, out: matrices, eps: T.float32, alpha: T.float32
        ):
            with T.Kernel(num_rows, threads=threads) as row:
                kernel_entry()
                scale = T.alloc_var(T.float32)
                factor = T.alloc_var(T.float32)
                norm = T.alloc_fragment((1,), T.float32)
                x = T.alloc_fragment((head_dim,), T.float32)
                squares = T.alloc_fragment((head_dim,), T.float32)
                layout = row_layout(head_dim, threads)
                T.annotate_layout({x: layout, squares: layout})

                scale = row_scale[row]
                load_row(matrix, row, scale, col_scale, x, squares, norm)
                factor = alpha / (T.sqrt(norm[0]) + eps)
                for col in T.Parallel(head_dim):
                    out[row, col] = x[col] * factor

        return engram_sinkhorn_finalize

    if not prefetch:

        @T.prim_func
        def engram_sinkhorn_finalize(
            matrix: matrices, row_scale: per_row, col_scale: per_col, out: matrices, eps: T.float32, alpha: T.float32
        ):
            with T.Kernel(T.ceildiv(num_rows, rows_per_cta), threads=threads) as block:
                kernel_entry()
                scale = T.alloc_var(T.float32)
                factor = T.alloc_var(T.float32)
                norm = T.alloc_fragment((1,), T.float32)
                cols = T.alloc_fragment((head_dim,), T.float32)  # col_scale's registers (dropped without "c")
                staged = T.alloc_shared((head_dim,), T.float32)  # the output row, with "w" (dropped without)
                x = T.alloc_fragment((head_dim,), T.float32)
                squares = T.alloc_fragment((head_dim,), T.float32)
                layout = row_layout(head_dim, threads)
                T.annotate_layout({cols: layout, x: layout, squares: layout})

                if cached:
                    T.copy(col_scale, cols, disable_tma=True)
                for i in T.serial(rows_per_cta):
                    row = block * rows_per_cta + i
                    if row < num_rows:
                        scale = row_scale[row]
                        if cached:
                            load_row(matrix, row, scale, cols, x, squares, norm)
                        else:
                            load_row(matrix, row, scale, col_scale, x, squares, norm)
                        factor = alpha / (T.sqrt(norm[0]) + eps)
                        store(out, row, x, factor, staged)

        return engram_sinkhorn_finalize

    vectors = head_dim // (threads * VEC)  # 8-column vectors a thread

    @T.macro
    def stage(matrix, stash, row, tid):
        """Row `row` of matrix into stash by cp.async, 16 bytes a copy, each thread the columns it holds in the row
        layout (so it reads back only what it wrote: no barrier); one commit group."""
        for v in T.unroll(vectors):
            for h in T.unroll(VEC // 4):
                col = (v * threads + tid) * VEC + h * 4
                T.ptx_cp_async(T.access_ptr(stash[col], "w", 4), T.access_ptr(matrix[row, col], "r", 4), 4)
        T.ptx_commit_group()

    @T.macro
    def scaled(source, scale, cols, col_scale, x, squares):
        """x = scale * source * col_scale (from registers with "c"), squares = x * x."""
        if cached:
            for col in T.Parallel(head_dim):
                x[col] = scale * source[col] * cols[col]
                squares[col] = x[col] * x[col]
        else:
            for col in T.Parallel(head_dim):
                x[col] = scale * source[col] * col_scale[col]
                squares[col] = x[col] * x[col]

    @T.prim_func
    def engram_sinkhorn_finalize(matrix: matrices, row_scale: per_row, col_scale: per_col, out: matrices, eps: T.float32, alpha: T.float32):
        with T.Kernel(T.ceildiv(num_rows, rows_per_cta), threads=threads) as block:
            kernel_entry()
            tid = T.get_thread_binding()
            scale = T.alloc_var(T.float32)
            factor = T.alloc_var(T.float32)
            norm = T.alloc_fragment((1,), T.float32)
            cols = T.alloc_fragment((head_dim,), T.float32)  # col_scale's registers (unused, so dropped, without "c")
            ahead = T.alloc_fragment((head_dim,), T.float32)  # the next row, with "p" (dropped with "s")
            stash = T.alloc_shared((head_dim,), T.float32)  # the next row, with "s" (dropped with "p")
            staged = T.alloc_shared((head_dim,), T.float32)  # the output row, with "w" (dropped without)
            x = T.alloc_fragment((head_dim,), T.float32)
            squares = T.alloc_fragment((head_dim,), T.float32)
            layout = row_layout(head_dim, threads)
            T.annotate_layout({cols: layout, ahead: layout, x: layout, squares: layout})

            first = block * rows_per_cta  # < num_rows: the grid has no empty CTA
            if cached:
                T.copy(col_scale, cols, disable_tma=True)
            if prefetch == "s":
                stage(matrix, stash, first, tid)
            else:
                for col in T.Parallel(head_dim):
                    ahead[col] = matrix[first, col]
            for i in T.serial(rows_per_cta):
                row = first + i
                if row < num_rows:
                    scale = row_scale[row]
                    if prefetch == "s":
                        T.ptx_wait_group(0)
                        scaled(stash, scale, cols, col_scale, x, squares)
                    else:
                        scaled(ahead, scale, cols, col_scale, x, squares)
                    if i + 1 < rows_per_cta and row + 1 < num_rows:
                        if prefetch == "s":
                            stage(matrix, stash, row + 1, tid)
                        else:
                            for col in T.Parallel(head_dim):
                                ahead[col] = matrix[row + 1, col]
                    T.reduce_sum(squares, norm)
                    factor = alpha / (T.sqrt(norm[0]) + eps)
                    store(out, row, x, factor, staged)

    return engram_sinkhorn_finalize
