"""The SwiGLU kernels' argument lists, written once: the forward's (swiglu.py, swiglu_generic.py and the Ascend
swiglu) and the backward's (swiglu_backward.py and the Ascend one).

TileLang takes a prim_func's parameters from its Python signature, so an argument list cannot be assembled from
parts (nor the forward's and the backward's share their common tail). Each kernel hands `forward` (or `backward`)
its dims (`forward_dims` / `backward_dims`), dtypes and scale-factor layout and its body, a @T.macro, and gets the
prim_func of its name: the arguments in the order of its declaration (tkaot/_quant/kernels.py, which the build
checks), the body given the tensors, and the runtime MoE scalars as one `MoeOptions`.
"""

from dataclasses import dataclass
from typing import NamedTuple

import tilelang.language as T

from kernels_src.quant.common import row_sf_type


@dataclass(frozen=True)
class MoeOptions:
    """The runtime scalars every SwiGLU kernel takes (the prim_func's own variables): expert segments, per-row
    weights, the clamp."""

    has_psum: T.Var
    alignment: T.Var
    search_steps: T.Var
    has_weights: T.Var
    routed_scaling_factor: T.Var
    has_clamp: T.Var
    clamp_value: T.Var


class ForwardDims(NamedTuple):
    """The runtime dims of every forward kernel but the row width and group (the generic kernels' own)."""

    num_rows: T.Var
    num_experts: T.Var
    x_stride: T.Var
    weights_stride: T.Var
    sf_stride: T.Var
    sf_group_stride: T.Var


def forward_dims() -> ForwardDims:
    names = ("num_rows", "num_experts", "x_stride", "topk_weights_stride", "sf_stride", "sf_group_stride")
    return ForwardDims(*(T.dynamic(name) for name in names))


def forward(name: str, dims: ForwardDims, hidden, dtype: str, out_dtype: str, sf_t, body):
    """The forward kernel `name` over rows of `hidden` columns a half (an int, or the generic kernels' dim), its
    out_sf of type sf_t; body(x, out, out_sf, psum_num_tokens_per_expert, topk_weights, clamped_count, moe,
    count_clamp) emits it."""
    num_rows = dims.num_rows

    def kernel(
        x: T.StridedTensor[(num_rows, 2 * hidden), (dims.x_stride, 1), dtype],
        out: T.Tensor[(num_rows, hidden), out_dtype],
        out_sf: sf_t,
        psum_num_tokens_per_expert: T.Tensor[(dims.num_experts,), T.int32],
        topk_weights: T.StridedTensor[(num_rows,), (dims.weights_stride,), T.float32],
        clamped_count: T.Tensor[(4,), T.int64],
        has_psum: T.int32,
        alignment: T.int32,
        search_steps: T.int32,
        has_weights: T.int32,
        routed_scaling_factor: T.float32,
        has_clamp: T.int32,
        clamp_value: T.float32,
        count_clamp: T.int32,
    ):
        body(
            x, out, out_sf, psum_num_tokens_per_expert, topk_weights, clamped_count,
            MoeOptions(has_psum, alignment, search_steps, has_weights, routed_scaling_factor, has_clamp, clamp_value), count_clamp,
        )  # fmt: skip

    kernel.__name__ = name  # the kernel's symbol
    return T.prim_func(kernel)


class BackwardDims(NamedTuple):
    """The runtime dims of both backward kernels."""

    num_rows: T.Var
    hidden: T.Var
    num_experts: T.Var
    x_sf_stride: T.Var
    sf_stride: T.Var
    sf_group_stride: T.Var


def backward_dims() -> BackwardDims:
    names = ("num_rows", "hidden", "num_experts", "x_sf_stride", "sf_stride", "sf_group_stride")
    return BackwardDims(*(T.dynamic(name) for name in names))


def backward(name: str, dims: BackwardDims, x_dtype: str, grad_dtype: str, out_dtype: str, fp8_dtype: str, packed: bool, body):
    """The backward kernel `name` over x of x_dtype, act_x_grad of grad_dtype, x_grad and act_out of out_dtype, the
    E4M3 cast in fp8_dtype with packed (UE8M0) scale factors or not; body(x, x_sf, act_x_grad, topk_weights,
    psum_num_tokens_per_expert, x_grad, x_grad_fp8, x_grad_sf, weight_grad, act_out, moe, recompute) emits it."""
    num_rows, hidden = dims.num_rows, dims.hidden

    def kernel(
        x: T.Tensor[(num_rows, 2 * hidden), x_dtype],
        x_sf: T.StridedTensor[(num_rows, hidden), (dims.x_sf_stride, 1), T.float32],
        act_x_grad: T.Tensor[(num_rows, hidden), grad_dtype],
        topk_weights: T.Tensor[(num_rows,), T.float32],
        psum_num_tokens_per_expert: T.Tensor[(dims.num_experts,), T.int32],
        x_grad: T.Tensor[(num_rows, 2 * hidden), out_dtype],
        x_grad_fp8: T.Tensor[(num_rows, 2 * hidden), fp8_dtype],
        x_grad_sf: row_sf_type((num_rows,), hidden, (dims.sf_stride, dims.sf_group_stride), packed),  # extents nominal
        weight_grad: T.Tensor[(num_rows,), T.float32],
        act_out: T.Tensor[(num_rows, hidden), out_dtype],
        has_psum: T.int32,
        alignment: T.int32,
        search_steps: T.int32,
        has_weights: T.int32,
        routed_scaling_factor: T.float32,
        has_clamp: T.int32,
        clamp_value: T.float32,
        recompute: T.int32,
    ):
        body(
            x, x_sf, act_x_grad, topk_weights, psum_num_tokens_per_expert, x_grad, x_grad_fp8, x_grad_sf, weight_grad, act_out,
            MoeOptions(has_psum, alignment, search_steps, has_weights, routed_scaling_factor, has_clamp, clamp_value), recompute,
        )  # fmt: skip

    kernel.__name__ = name  # the kernel's symbol
    return T.prim_func(kernel)
