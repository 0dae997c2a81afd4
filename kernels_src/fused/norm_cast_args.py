"""The norm_cast kernels' argument list, written once: the CUDA kernel's (norm_cast.py, norm_cast_generic.py) and the
Ascend one's (kernels_src/ascend/norm_cast.py and its generic tier).

TileLang takes a prim_func's parameters from its Python signature, so each kernel hands `norm_cast` the types of its
arguments and its body, a @T.macro whose parameters are the kernel's under their own names (TileLang names a Var
after the macro parameter it is bound to), and gets the prim_func: the arguments in the order of the declaration
(tkaot/_quant/kernels.py, NORM_CAST, which the build checks).
"""

import tilelang.language as T


def norm_cast(rows, dtype: str, fp8_dtype: str, weight_t, sf_t, rstd_t, body):
    """The norm_cast prim_func. rows(name, dtype): the type of the (batch, tokens, hidden) argument `name` (x,
    residual, residual_out, out, out_bf16); weight_t, sf_t, rstd_t: those of weight, out_sf and rstd; body(x, weight,
    residual, residual_out, out, out_sf, out_bf16, rstd, eps, out_scale, has_weight, has_residual, has_rstd,
    has_out_bf16) emits the kernel."""

    def norm_cast(
        x: rows("x", dtype),
        weight: weight_t,
        residual: rows("residual", dtype),
        residual_out: rows("residual_out", dtype),
        out: rows("out", fp8_dtype),
        out_sf: sf_t,
        out_bf16: rows("out_bf16", T.bfloat16),
        rstd: rstd_t,
        eps: T.float32,
        out_scale: T.float32,
        has_weight: T.int32,
        has_residual: T.int32,
        has_rstd: T.int32,
        has_out_bf16: T.int32,
    ):
        body(
            x, weight, residual, residual_out, out, out_sf, out_bf16, rstd, eps, out_scale, has_weight, has_residual, has_rstd, has_out_bf16
        )

    return T.prim_func(norm_cast)
