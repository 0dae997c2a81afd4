"""torch.compile and torch.export of tkaot's ops, on CPU (tkaot/_compile.py).

Every public op is also the custom op tkaot::<name>. Its fake kernel must describe exactly what the op returns:
for calls of every op (inputs, given buffers, flags, layouts), the traced call on meta tensors (custom op -> fake
kernel) and the real op on meta tensors (a recorder in place of the launcher) return the same structure, the same
inputs in the same places and new tensors of the same shape, dtype, strides and offset; the custom op's real kernel
returns those new tensors. Then a decode step of tkaot ops traces with fullgraph=True (fake CUDA tensors, dynamic
token count too), runs through aot_eager (functionalised mutations), and exports; and `import tkaot` registers nothing.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tkaot
from bench.decode import empty_state, step
from tests.helpers import meta
from tkaot import _compile, _op

BF16, F32, F8, I8, I32, I64 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int8, torch.int32, torch.int64
FAMILIES = _compile.op_families()
ALIASES = {"moe_topk_gate"}  # calls moe_topk_gate_forward


def public_ops() -> dict:
    ops = {}
    for family in FAMILIES:
        module = getattr(tkaot, family)
        for name in module.__all__:
            if name not in ALIASES:
                ops[name] = getattr(module, name)
    return ops


def traced_op(fn) -> _compile.TracedOp:
    return vars(sys.modules[fn.__module__])[f"_traced_{fn.__name__}"]


@pytest.fixture
def no_launch(monkeypatch):
    """Meta tensors read as device 0, and every launcher does nothing: the real ops run on meta tensors."""
    get_device = torch.Tensor.get_device
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0 if self.device.type == "meta" else get_device(self))
    monkeypatch.setattr(_op.OpKernels, "get", lambda self, device, *values, general_tiling=None: lambda *args: None)
    for fn in public_ops().values():
        module = sys.modules[fn.__module__]
        if hasattr(module, "current_stream"):
            monkeypatch.setattr(module, "current_stream", lambda device: 0)
        for value in vars(module).values():
            if isinstance(value, _op.OpKernels):
                monkeypatch.setattr(value, "cache", {})
    monkeypatch.setattr("tkaot._quant.weight_casts._values_unchecked", lambda: True)  # no value checks on meta tensors
    monkeypatch.setattr("tkaot._engram.device.sm_count", lambda device: 132)  # an H200's SMs: engram's per-SM partials


def col(rows, cols, dtype=F32, pad=4):
    """A column-major sf buffer, token stride padded to `pad` elements."""
    pitch = -(-rows // pad) * pad
    return meta(cols, pitch, dtype=dtype).t()[:rows]


def pair(tokens, hidden, block=(1, 128), fp4=False, sf_dtype=F32):
    data = meta(tokens, hidden // 2, dtype=I8) if fp4 else meta(tokens, hidden, dtype=F8)
    groups = hidden // block[1]
    cols = -(-groups // 4) if sf_dtype is I32 else groups
    return data, meta(-(-tokens // block[0]), cols, dtype=sf_dtype)


def f32(*shape):
    return meta(*shape, dtype=F32)


def recompute_args(layers, post, tokens=5, m=4, hidden=512) -> tuple:
    """mhc_multilayer_recompute's arguments: `layers` layer inputs (and pre mixes), `post` residuals (and their inputs)."""
    return (
        meta(tokens, m, hidden),
        [f32(tokens, m, 1) for _ in range(layers)],
        [meta(tokens, hidden) for _ in range(post)],
        [f32(tokens, m, 1) for _ in range(post)],
        [f32(tokens, m, m) for _ in range(post)],
        [meta(tokens, hidden) for _ in range(layers)],
        [meta(tokens, m, hidden) for _ in range(post)],
    )


q = tkaot.quant
# (op name, args, kwargs): calls the real ops accept, covering given buffers, flags and layouts
CALLS = [
    ("norm_forward", lambda: (meta(5, 512), meta(512), 1e-6), {}),
    ("norm_forward", lambda: (meta(5, 512), None, 1e-6), dict(with_rstd=True)),
    ("norm_forward", lambda: (meta(2, 3, 512, dtype=F32), meta(512, dtype=F32), 1e-6), dict(residual=meta(2, 3, 512, dtype=F32))),
    ("norm_forward", lambda: (meta(5, 512), meta(512), 1e-6),
     dict(residual=meta(5, 512), out=meta(5, 512), residual_out=meta(5, 512), with_rstd=True)),
    ("norm_forward", lambda: (meta(5, 512, strides=(1024, 1)), meta(512), 1e-6), dict(residual=meta(5, 512))),
    ("norm_forward_and_per_token_cast", lambda: (meta(5, 512), meta(512), 1e-6, "e4m3", 32), {}),
    ("norm_forward_and_per_token_cast", lambda: (meta(2, 5, 512), meta(512), 1e-6, "e4m3", 32),
     dict(residual=meta(2, 5, 512), use_tma_aligned_col_major_sf=True, with_out_bf16=True, with_rstd=True)),
    ("norm_forward_and_per_token_cast", lambda: (meta(5, 512), None, 1e-6, "e4m3", 32),
     dict(round_sf=True, use_packed_ue8m0=True, use_tma_aligned_col_major_sf=True)),
    ("norm_forward_and_per_token_cast", lambda: (meta(5, 512), meta(512), 1e-6, "e4m3", 32),
     dict(out=(meta(5, 512, dtype=F8), None), out_bf16=meta(5, 512), with_out_bf16=True, residual=meta(5, 512),
          residual_out=meta(5, 512))),
    ("norm_forward_and_per_token_cast", lambda: (meta(5, 512), meta(512), 1e-6, "e4m3", 32), dict(out=(None, meta(5, 16, dtype=F32)))),
    ("norm_forward_and_per_token_cast", lambda: (meta(5, 512), meta(512), 1e-6, "bf16", None), dict(residual=meta(5, 512), with_rstd=True)),
    ("swiglu_forward", lambda: (meta(5, 1024), "bf16"), {}),
    ("swiglu_forward", lambda: (meta(5, 1024, dtype=F32), "fp32"), dict(clamp_value=3.0, clamped_count=meta(4, dtype=I64))),
    ("swiglu_forward_and_per_token_cast", lambda: (meta(5, 1024), "e4m3", 128), {}),
    ("swiglu_forward_and_per_token_cast", lambda: (meta(7, 1024), "e4m3", 32),
     dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)),
    ("swiglu_forward_and_per_token_cast", lambda: (meta(7, 1024), "e4m3", 32), dict(use_tma_aligned_col_major_sf=True)),
    ("swiglu_forward_and_per_token_cast", lambda: (meta(5, 1024), "bf16", None), {}),
    ("norm_backward", lambda: (meta(5, 512), meta(5, 512), meta(512), f32(5)), {}),
    ("norm_backward", lambda: (meta(5, 512), meta(5, 512), None, f32(5)), dict(residual_out_grad=meta(5, 512), out_scale=0.5)),
    ("norm_backward", lambda: (f32(5, 512), f32(5, 512), f32(512), f32(5)), dict(residual_out_grad=f32(5, 512), weight_grad=f32(512))),
    ("norm_backward", lambda: (meta(5, 512, strides=(1024, 1)), meta(5, 512), meta(512), f32(5)), dict(weight_grad=f32(512))),
    ("norm_backward", lambda: (meta(0, 512), meta(0, 512), meta(512), f32(0)), {}),
    ("swiglu_backward", lambda: (meta(5, 1024), meta(5, 512), "bf16"), {}),
    ("swiglu_backward", lambda: (f32(2, 3, 1024), f32(2, 3, 512), "bf16"),
     dict(psum_num_tokens_per_expert=meta(4, dtype=I32), topk_weights=f32(6), routed_scaling_factor=2.5, clamp_value=7.0,
          do_recompute=True)),
    ("swiglu_backward", lambda: (f32(5, 1024), f32(5, 512), "fp32"), dict(topk_weights=f32(5))),
    ("swiglu_backward", lambda: (meta(5, 1024), meta(5, 512), "bf16"), dict(do_recompute=True)),
    ("swiglu_backward_and_per_token_cast", lambda: ((meta(5, 1024, dtype=F8), f32(5, 8)), meta(5, 512), "e4m3", 128), {}),
    ("swiglu_backward_and_per_token_cast", lambda: ((meta(5, 1024, dtype=F8), f32(5, 32)), f32(5, 512), "e4m3", 32),
     dict(use_tma_aligned_col_major_sf=True)),
    ("swiglu_backward_and_per_token_cast", lambda: ((meta(5, 1024, dtype=F8), f32(5, 32)), meta(5, 512), "e4m3", 32),
     dict(round_sf=True)),
    ("swiglu_backward_and_per_token_cast", lambda: ((meta(7, 1024, dtype=F8), f32(7, 8)), meta(7, 512), "e4m3", 128),
     dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)),
    ("swiglu_backward_and_per_token_cast", lambda: ((meta(6, 1024, dtype=F8), f32(6, 32)), meta(6, 512), "e4m3", 32),
     dict(round_sf=True, use_packed_ue8m0=True, psum_num_tokens_per_expert=meta(2, dtype=I32), topk_weights=f32(6),
          routed_scaling_factor=2.5, clamp_value=7.0, do_recompute=True)),
    ("swiglu_backward_and_per_token_cast", lambda: ((meta(0, 1024, dtype=F8), f32(0, 8)), meta(0, 512), "e4m3", 128),
     dict(use_tma_aligned_col_major_sf=True, topk_weights=f32(0))),
    ("swiglu_backward_and_per_token_cast", lambda: (meta(5, 1024), meta(5, 512), "bf16", None), dict(do_recompute=True)),
    ("swiglu_backward_and_per_token_cast", lambda: (f32(2, 3, 1024), f32(2, 3, 512), "fp32", 128),
     dict(topk_weights=f32(6), use_tma_aligned_col_major_sf=True)),
    ("per_token_cast", lambda: (meta(5, 512), "e4m3", 128), {}),
    ("per_token_cast", lambda: (meta(5, 512), "e2m1", 32), dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)),
    ("per_token_cast", lambda: (meta(6, 512, dtype=F32), "e4m3", 64), dict(use_tma_aligned_col_major_sf=True, use_e4m3_sf=True)),
    ("per_token_cast", lambda: (meta(5, 512), "e4m3", 128), dict(out=(meta(5, 512, dtype=F8), meta(5, 4, dtype=F32)))),
    ("per_token_cast", lambda: (pair(5, 512), "e4m3", 32), dict(x_block_size=(1, 128))),
    ("per_token_cast_with_sf_only", lambda: (meta(5, 512), "e4m3", 128), dict(round_sf=True)),
    ("per_token_cast_with_sf_only", lambda: (meta(5, 512), "e4m3", 128), dict(out_sf=meta(5, 4, dtype=F32))),
    ("per_token_cast_with_precomputed_sf", lambda: (meta(5, 512), "e4m3", 128, meta(5, 4, dtype=F32)), {}),
    ("per_token_cast_and_cast_back", lambda: (meta(5, 512), "e4m3", 128), {}),
    ("cast_back", lambda: (pair(5, 512), "bf16", (1, 128)), {}),
    ("cast_back", lambda: (pair(256, 512, block=(128, 128), fp4=True, sf_dtype=I32), "fp32", (128, 128)), {}),
    ("per_token_cast_back", lambda: (pair(5, 512, block=(1, 32)), "fp32", 32), {}),
    ("per_block_cast", lambda: (meta(130, 512), "e4m3", (128, 128)), {}),
    ("per_block_cast", lambda: (meta(130, 512, dtype=F32), "e2m1", (32, 32)),
     dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)),
    ("per_block_cast", lambda: (meta(64, 512), "e4m3", (32, 128)), dict(out=(meta(64, 512, dtype=F8), meta(2, 4, dtype=F32)))),
    ("per_block_cast_with_sf_only", lambda: (meta(130, 512), "e4m3", (128, 128)), dict(use_tma_aligned_col_major_sf=True)),
    ("per_block_cast_with_precomputed_sf", lambda: (meta(130, 512), "e4m3", (128, 128), meta(2, 4, dtype=F32)), {}),
    ("per_channel_cast", lambda: (meta(130, 512), "e4m3", 128), {}),
    ("per_channel_cast", lambda: (meta(130, 512), "e4m3", 32), dict(round_sf=True, use_packed_ue8m0=True)),
    ("per_channel_cast", lambda: (pair(64, 512), "e4m3", 32), dict(num_per_channels=128)),
    ("cast", lambda: (meta(3, 5, 64), F8), {}),
    ("cast", lambda: (meta(7, 64, dtype=F32), BF16), dict(stochastic_rounding=True)),
    ("unpack_from_e2m1fn_x2", lambda: (meta(3, 8, dtype=I8),), dict(out_dtype=BF16)),
    ("per_block_cast_lossless", lambda: (pair(256, 512, block=(1, 32), fp4=True), "e4m3", (1, 32), (128, 128)), {}),
    ("per_block_cast_lossless", lambda: (pair(130, 512, block=(1, 32), fp4=True, sf_dtype=I32), "e4m3", (1, 32), (32, 128)),
     dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)),
    ("batched_transpose_weight_sf", lambda: ([meta(4, 8, dtype=F32), meta(3, 2, 4, dtype=F32)], 128, [False, True], [None, None]), {}),
    ("batched_transpose_weight_sf",
     lambda: ([meta(4, 8, dtype=F32)], 128, [False], [(meta(2, 512, dtype=I32).t(), meta(1, 1024, dtype=I32).t())]), {}),
    ("moe_topk_gate_forward", lambda: (meta(5, 256, dtype=F32), 8, False, 0, 2.5, 0), {}),
    ("moe_topk_gate_forward", lambda: (meta(5, 256, dtype=F32), 6, True, 2, 1.0, 3),
     dict(bias=meta(256, dtype=F32), scores=meta(5, 256, dtype=F32), unmapped_topk_idx=meta(5, 6, dtype=I64))),
    ("moe_topk_gate_forward", lambda: (meta(5, 256, dtype=F32), 8, False, 0, 2.5, 0),
     dict(out=(meta(5, 8, dtype=I64), meta(5, 8, dtype=F32)))),
    ("moe_topk_gate_backward", lambda: (f32(5, 256), meta(5, 8, dtype=I64), f32(5, 8), f32(5, 8), 2.5), {}),
    ("moe_topk_gate_backward", lambda: (f32(6, 72), meta(6, 6, dtype=I64), f32(6, 6), f32(6, 6), 1.0),
     dict(mask=meta(6, dtype=torch.bool), grad_scores_sum=f32(2, 72))),
    ("moe_topk_gate_backward", lambda: (f32(5, 256), meta(5, 8, dtype=I64), f32(5, 8), f32(5, 8), 2.5),
     dict(mask=meta(5, dtype=torch.bool), grad_scores_sum=f32(1, 256), out=f32(5, 256))),
    ("topk_gate", lambda: (meta(5, 72, dtype=F32), 6), {}),
    ("normalize_weight", lambda: (meta(5, 8, dtype=F32),), {}),
    ("apply_rotary", lambda: (meta(5, 16, 64), meta(4096, 64, dtype=F32)), dict(key=meta(5, 1, 64), positions=meta(5, dtype=I64))),
    ("apply_rotary", lambda: (meta(2, 5, 4, 128, dtype=F32), meta(4096, 128, dtype=F32)), dict(interleaved=True, seqlen_offset=3)),
    ("expand_to_mhc_fwd", lambda: (meta(5, 64), meta(5, 4, 64)), {}),
    ("expand_to_mhc_bwd", lambda: (meta(5, 4, 64), meta(5, 64)), {}),
    ("mhc_pre_apply_mix_fwd", lambda: (meta(5, 4, 64), meta(5, 4, dtype=F32), meta(5, 64)), {}),
    ("mhc_pre_apply_mix_bwd", lambda: (meta(5, 64), meta(5, 4, 64), meta(5, 4, dtype=F32), meta(5, 4, 64)), {}),
    ("mhc_pre_split_mixes_fwd", lambda: (meta(5, 24, dtype=F32), meta(3, dtype=F32), meta(24, dtype=F32), meta(5, 4, dtype=F32),
                                         meta(5, 4, dtype=F32), meta(5, 16, dtype=F32), 2.0, 1e-6), {}),
    ("mhc_pre_split_mixes_bwd", lambda: (meta(5, 4, dtype=F32), meta(5, 4, dtype=F32), meta(5, 16, dtype=F32), meta(5, 24, dtype=F32),
                                         meta(5, 4, dtype=F32), meta(3, dtype=F32), meta(24, dtype=F32), meta(5, 24, dtype=F32),
                                         meta(3, dtype=F32), meta(24, dtype=F32), 2.0), {}),
    ("mhc_sinkhorn_fwd", lambda: (meta(5, 4, 4, dtype=F32), meta(5, 4, 4, dtype=F32), 20, 1e-6), {}),
    ("mhc_sinkhorn_bwd", lambda: (meta(5, 4, 4, dtype=F32), meta(5, 4, 4, dtype=F32), meta(5, 4, 4, dtype=F32), 3, 1e-6), {}),
    ("mhc_post_fwd", lambda: (meta(2, 3, 64), meta(2, 3, 4, 64), meta(2, 3, 4, 1, dtype=F32), meta(2, 3, 4, 4, dtype=F32)), {}),
    ("mhc_post_fwd", lambda: (meta(1, 3, 64), meta(1, 3, 4, 64), meta(1, 3, 4, 1, dtype=F32), meta(1, 3, 4, 4, dtype=F32)),
     dict(out=meta(1, 3, 4, 64))),
    ("mhc_post_bwd", lambda: (meta(2, 3, 64), meta(2, 3, 4, 64), meta(2, 3, 4, 1, dtype=F32), meta(2, 3, 4, 4, dtype=F32),
                              meta(2, 3, 4, 64)), {}),
    # tkaot.mhc: every op writes given buffers and returns None
    ("mhc_head_compute_mix_fwd", lambda: (f32(5, 4), f32(1), f32(4), f32(5, 4), 1e-6), {}),
    ("mhc_head_compute_mix_fwd", lambda: (f32(0, 7), f32(1), f32(7), f32(0, 7), 1e-6), dict(token_block_size=64)),
    ("mhc_head_compute_mix_bwd", lambda: (f32(5, 4), f32(5, 4), f32(1), f32(4), f32(5, 4), f32(132, 1), f32(132, 4), 132), {}),
    ("mhc_head_compute_mix_bwd", lambda: (f32(9, 8), f32(9, 8), f32(1), f32(8), f32(9, 8), f32(3, 1), f32(3, 8), 3),
     dict(token_block_size=4)),
    ("mhc_fn_normw_merge_fwd", lambda: (f32(24, 512), f32(512), f32(24, 512)), {}),
    ("mhc_fn_normw_merge_bwd", lambda: (f32(24, 512), f32(512), f32(24, 512), f32(24, 512), f32(512)), {}),
    ("mhc_reduce_partials_and_rmsnorm_fwd",
     lambda: (f32(16, 5, 1, 24), f32(16, 5, 1), f32(5, 1, 24), f32(5, 1), f32(5, 24), 2048, 1e-6, 16), {}),
    ("mhc_reduce_partials_and_rmsnorm_fwd",
     lambda: (f32(3, 5, 2, 24), f32(3, 5, 2), f32(5, 2, 24), f32(5, 2), f32(5, 24), 1024, 1e-6, 3), {}),
    ("mhc_reduce_partials_and_rmsnorm_bwd", lambda: (f32(5, 24), f32(5, 2, 24), f32(5, 2), f32(5, 2, 24), f32(5, 2), 1024, 1e-6), {}),
    ("mhc_pre_big_fuse_fwd",
     lambda: (f32(16, 5, 24), f32(16, 5), f32(3), f32(24), meta(5, 4, 512), f32(5, 4), f32(5, 16), meta(5, 512), *[1e-6] * 3, 2.0, 20),
     {}),
    ("mhc_pre_big_fuse_fwd",
     lambda: (f32(2, 5, 3), f32(2, 5), f32(3), f32(3), meta(5, 1, 64), f32(5, 1), f32(5, 1), meta(5, 64), 1e-6, 1e-6, 1e-6, 1.0, 0),
     dict(n_splits=2)),
    ("mhc_multilayer_recompute", lambda: recompute_args(layers=3, post=3), {}),
    ("mhc_multilayer_recompute", lambda: recompute_args(layers=2, post=1), {}),
    ("mhc_multilayer_recompute", lambda: recompute_args(layers=1, post=0, m=8), {}),
    # tkaot.engram
    ("engram_hash", lambda: (meta(5, 3, dtype=I32), meta(2, 3, dtype=I64), meta(2, 2, 8, dtype=I32), meta(2, 16, dtype=I32)), {}),
    ("engram_hash", lambda: (meta(5, 2, dtype=I32), meta(1, 2, dtype=I64), meta(1, 1, 4, dtype=I32), meta(1, 4, dtype=I32)),
     dict(image_token_mask=meta(5, dtype=torch.bool))),
    ("fused_weight", lambda: (meta(4, 512), meta(4, 512)), {}),
    ("engram_gate_fwd", lambda: (meta(5, 4, 512), meta(5, 5, 512), f32(4, 512), 1e-6, 1e-6), {}),
    ("engram_gate_fwd", lambda: (meta(5, 2, 256), meta(5, 3, 256), f32(2, 256), 1e-6, 1e-6),
     dict(save_for_backward=False, image_token_mask=meta(5, dtype=torch.bool))),
    ("engram_gate_fwd", lambda: (meta(5, 4, 512), meta(5, 5, 512), f32(4, 512), 1e-6, 1e-6), dict(save_for_backward=False, inplace=True)),
    ("engram_gate_bwd", lambda: (meta(5, 4, 512), meta(5, 4, 512), meta(5, 5, 512), f32(4, 512), *[f32(5, 4)] * 4, 1e-6), {}),
    ("engram_gate_bwd", lambda: (meta(5, 4, 512), meta(5, 4, 512), meta(5, 5, 512), f32(4, 512), *[f32(5, 4)] * 4, 1e-6),
     dict(image_token_mask=meta(5, dtype=torch.bool))),
    ("grad_w_reduce", lambda: (f32(132, 4, 512), meta(4, 512), meta(4, 512), f32(4, 512), f32(4, 512)), {}),
    ("engram_sinkhorn_momentum_update", lambda: (meta(64, 512), meta(64, 512), 0.9), {}),
    ("engram_sinkhorn_momentum_update", lambda: (f32(3, 8), meta(24), 0.9), dict(nesterov=False)),
    ("engram_sinkhorn_step", lambda: (f32(64, 512), f32(64), f32(512), 1e-6), {}),
    ("engram_sinkhorn_step_reduce", lambda: (f32(396, 512), f32(512)), {}),
    ("engram_sinkhorn_finalize", lambda: (f32(64, 512), f32(64), f32(512), 1e-6, 2.0), {}),
    ("engram_sinkhorn_finalize", lambda: (f32(64, 512), f32(64), f32(512), 1e-6, 2.0), dict(out=f32(64, 512))),
]  # fmt: skip


def test_every_public_op_is_a_custom_op_and_every_call_is_covered():
    ops = public_ops()
    for name, fn in ops.items():
        op = traced_op(fn)
        assert op.name == name and op.fn is fn and hasattr(torch.ops.tkaot, name)
        schema = str(getattr(torch.ops.tkaot, name).o0._schema)
        for arg in op.mutates:
            assert f"!) {arg}" in schema or f"!)? {arg}" in schema or f"!)[] {arg}" in schema, (name, arg, schema)
    assert {name for name, _, _ in CALLS} == set(ops)
    assert _compile.register_all() == sorted(ops)


def _values(fn, args, kwargs) -> tuple:
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return tuple(bound.arguments.values())


def _inputs(values) -> list:
    return [t for t in _compile._leaves(list(values)) if isinstance(t, torch.Tensor)]


def _same_result(traced, real, inputs, offsets: bool = True) -> None:
    """Leaf by leaf: both None, the same input, or new tensors of the same shape, dtype, strides and (with `offsets`) storage
    offset."""
    t_leaves, r_leaves = _compile._leaves(traced), _compile._leaves(real)
    assert len(t_leaves) == len(r_leaves), (traced, real)
    for t, r in zip(t_leaves, r_leaves):
        if r is None or not isinstance(r, torch.Tensor):
            assert t is r
            continue
        given = [i for i, x in enumerate(inputs) if x is r]
        if given:
            assert [i for i, x in enumerate(inputs) if x is t] == given
            continue
        assert not any(x is t for x in inputs)
        assert (t.shape, t.dtype, t.stride()) == (r.shape, r.dtype, r.stride())
        assert not offsets or t.storage_offset() == r.storage_offset()


@pytest.mark.parametrize("name, make, kwargs", CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(CALLS)])
def test_fake_kernels_describe_what_the_real_op_returns(no_launch, name, make, kwargs):
    fn = public_ops()[name]
    op = traced_op(fn)
    args = make()
    values = _values(fn, args, kwargs)
    real = fn(*args, **kwargs)  # the real op, eager, on meta tensors
    traced = op(*values)  # the traced call: the custom op, whose fake kernel runs on meta tensors
    # batched_transpose_weight_sf's new outputs are views of one allocation (at offsets); traced, each is its own tensor
    offsets = name != "batched_transpose_weight_sf"
    _same_result(traced, real, _inputs(values), offsets)
    # the real kernel behind the custom op returns the op's new tensors, as the fake kernel does
    flat = op.flatten(values)
    from_real, from_fake = op._real(*flat), op._fake_kernel(*flat)
    as_list = lambda outs: [] if outs is None else [outs] if isinstance(outs, torch.Tensor) else list(outs)
    _same_result(as_list(from_fake), as_list(from_real), _inputs(values), offsets)


def test_schema_round_trip_keeps_every_argument():
    fn = tkaot.quant.batched_transpose_weight_sf
    op = traced_op(fn)
    a, b = meta(4, 8, dtype=F32), meta(4, 8, dtype=F32)
    outs = [None, (meta(2, 2), meta(2, 2))]
    values = (fn and [a, b], 128, [True, False], outs)
    back = op.unflatten(op.flatten(values))
    assert back[0] == [a, b] and back[2] == [True, False] and back[3][0] is None and back[3][1][0] is outs[1][0]
    op = traced_op(tkaot.quant.per_token_cast)
    x = pair(5, 512)
    values = _values(op.fn, (x, "e4m3", 32), dict(x_block_size=(1, 128), out=(None, meta(5, 16))))
    back = op.unflatten(op.flatten(values))
    assert back[0] == x and back[3] == (1, 128) and back[-1][0] is None and back[-1][1] is values[-1][1]


def test_a_traced_call_past_the_output_limit_says_so():
    from tkaot._quant.weight_casts import MAX_TRACED_WEIGHTS

    op = traced_op(tkaot.quant.batched_transpose_weight_sf)
    n = MAX_TRACED_WEIGHTS + 1
    with pytest.raises(ValueError, match="at most 8 new tensors"):
        op([meta(4, 8, dtype=F32)] * n, 128, [False] * n, [None] * n)


# ---- the decode step of bench/decode.py, traced


def fake_state(tokens: int) -> dict:
    with FakeTensorMode():
        return empty_state(tokens)


def compiled_graphs(fn, *args, **options) -> list:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=backend, **options)(*args)
    return graphs


def _tkaot_calls(gm) -> list[str]:
    return [str(n.target).split(".")[1] for n in gm.graph.nodes if n.op == "call_function" and str(n.target).startswith("tkaot.")]


def test_decode_step_traces_in_one_graph_with_fake_cuda_tensors():
    state = fake_state(3)
    (gm,) = compiled_graphs(step, state)  # fullgraph=True: a graph break raises
    assert _tkaot_calls(gm) == [
        "norm_forward", "per_token_cast", "apply_rotary", "norm_forward", "moe_topk_gate_forward", "swiglu_forward_and_per_token_cast",
    ]  # fmt: skip
    outs = gm(*[state[k] for k in ("res", "h", "w_attn", "q", "cos_sin", "k", "positions", "attn_out", "w_ffn", "logits", "gate_up")])
    assert all(t.device.type == "cuda" for t in outs)


def test_decode_step_traces_with_a_dynamic_token_count():
    state = fake_state(5)
    for t in state.values():
        if t.shape[0] == 5:
            torch._dynamo.mark_dynamic(t, 0)
    (gm,) = compiled_graphs(step, state)
    assert len(_tkaot_calls(gm)) == 6
    assert any(isinstance(d, torch.SymInt) for n in gm.graph.nodes for d in getattr(n.meta.get("example_value"), "shape", ()))


def test_decode_step_runs_through_aot_eager_on_meta_tensors(no_launch):
    """aot_eager functionalises the in-place rotary and the out= buffers; the compiled step returns what eager returns."""
    state = empty_state(3, device="meta")
    eager = step(state)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(state)
    assert compiled.keys() == eager.keys()
    for key in eager:
        e, c = eager[key], compiled[key]
        assert (c.shape, c.dtype, c.stride()) == (e.shape, e.dtype, e.stride()), key

    def with_buffers(x, w, r, out, residual_out):
        result = tkaot.quant.norm_forward(x, w, 1e-6, residual=r, out=out, residual_out=residual_out, with_rstd=True)
        return result[1], result[0] is out

    torch._dynamo.reset()
    x, w, r, out, ro = meta(4, 512), meta(512), meta(4, 512), meta(4, 512), meta(4, 512)
    rstd, same = torch.compile(with_buffers, fullgraph=True, backend="aot_eager")(x, w, r, out, ro)
    assert same and rstd.shape == (4,)


def test_static_state_is_all_static_inputs_and_the_rotary_needs_no_clone(no_launch):
    """bench.decode.mark_static: every state tensor is a static input of the functionalised graph (what lets CUDA graph
    trees replay a step that writes q and k), and Inductor's reinplacing leaves no op a clone to make (the in-place
    rotary writes the inputs themselves)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.fx_passes.reinplace import reinplace_inplaceable_ops
    from torch._inductor.fx_utils import FakeTensorUpdater

    from bench.decode import mark_static

    seen = {}

    def forward_compiler(gm, inputs):
        seen["static"] = torch._guards.TracingContext.get().fw_metadata.static_input_indices
        takes_module = "gm" in inspect.signature(FakeTensorUpdater).parameters  # a GraphModule in torch 2.13, a Graph before
        reinplace_inplaceable_ops(FakeTensorUpdater(gm if takes_module else gm.graph), gm.graph)
        seen["clones"] = {
            n.args[0].name(): n.meta.get("only_clone_these_tensors")
            for n in gm.graph.nodes
            if n.target is torch.ops.higher_order.auto_functionalized_v2
        }
        return gm.forward

    torch._dynamo.reset()
    state = mark_static(empty_state(3, device="meta"))
    backend = aot_autograd(fw_compiler=forward_compiler, keep_inference_input_mutations=True)
    torch.compile(step, fullgraph=True, backend=backend)(state)
    assert seen["static"] == list(range(len(state)))
    assert "tkaot::apply_rotary.o0" in seen["clones"] and not any(seen["clones"].values())


def test_mhc_and_engram_ops_trace_and_functionalise_on_meta_tensors(no_launch):
    """Written tensor lists (mhc_multilayer_recompute's Tensor(a!)[]), an op that writes its input only when asked
    (engram_gate_fwd's inplace) and per-SM partials (engram_sinkhorn_step), through aot_eager: what eager returns."""

    def layers(x, lists, kv, w, matrix, row_scale, col_scale):
        tkaot.mhc.mhc_multilayer_recompute(x[:, :4].contiguous(), *lists)
        out = tkaot.engram.engram_gate_fwd(x, kv, w, 1e-6, 1e-6, save_for_backward=False, inplace=True)[0]
        norm, partial = tkaot.engram.engram_sinkhorn_step(matrix, row_scale, col_scale, 1e-6)
        return out, norm, partial, lists[-1][0]

    recompute = recompute_args(layers=2, post=1)
    args = (meta(5, 4, 512), list(recompute[1:]), meta(5, 5, 512), f32(4, 512), f32(64, 512), f32(64), f32(512))
    (gm,) = compiled_graphs(layers, *args)
    assert _tkaot_calls(gm) == ["mhc_multilayer_recompute", "engram_gate_fwd", "engram_sinkhorn_step"]
    eager = layers(*args)
    torch._dynamo.reset()
    compiled = torch.compile(layers, fullgraph=True, backend="aot_eager")(*args)
    assert compiled[0] is args[0] and compiled[3] is args[1][-1][0]  # the written input and list member, handed back
    for e, c in zip(eager, compiled):
        assert (c.shape, c.dtype, c.stride()) == (e.shape, e.dtype, e.stride())


def test_backward_ops_trace_and_functionalise_on_meta_tensors(no_launch):
    """A backward step: norm_backward accumulating into a given weight_grad, swiglu_backward_and_per_token_cast with all
    five new outputs, moe_topk_gate_backward into out=; one graph, and through aot_eager what eager returns."""

    def backward(og, x, w, rstd, wg, x8, sf, act_grad, psum, weights, scores, idx, topk_weights, grad_weights, out):
        x_grad, weight_grad = tkaot.quant.norm_backward(og, x, w, rstd, weight_grad=wg)
        swiglu = tkaot.quant.swiglu_backward_and_per_token_cast(
            (x8, sf), act_grad, "e4m3", 32, psum, weights, 2.5, True, True, True, 7.0, True
        )  # fmt: skip
        logits_grad = tkaot.moe.moe_topk_gate_backward(scores, idx, topk_weights, grad_weights, 2.5, out=out)
        return x_grad, weight_grad, *swiglu[:1], *swiglu[1], *swiglu[2:], logits_grad

    args = (meta(5, 512), meta(5, 512), meta(512), f32(5), f32(512), meta(6, 1024, dtype=F8), f32(6, 32), meta(6, 512),
            meta(2, dtype=I32), f32(6), f32(5, 256), meta(5, 8, dtype=I64), f32(5, 8), f32(5, 8), f32(5, 256))  # fmt: skip
    (gm,) = compiled_graphs(backward, *args)
    assert _tkaot_calls(gm) == ["norm_backward", "swiglu_backward_and_per_token_cast", "moe_topk_gate_backward"]
    eager = backward(*args)
    torch._dynamo.reset()
    compiled = torch.compile(backward, fullgraph=True, backend="aot_eager")(*args)
    assert compiled[1] is args[4] and compiled[-1] is args[-1]  # the written weight_grad and out, handed back
    assert len(compiled) == len(eager) == 8
    for e, c in zip(eager, compiled):
        assert (c.shape, c.dtype, c.stride()) == (e.shape, e.dtype, e.stride())


def test_rand_traces_natively_and_set_seed_reproduces():
    """tkaot.rand is torch.randn and torch.manual_seed, not custom ops: Dynamo traces randn / randn_like in one graph
    (fullgraph=True), and set_seed before a compiled call gives the numbers eager gives."""

    def draw(x):
        return tkaot.rand.randn(2, 3, device="cpu") + 1, tkaot.rand.randn_like(x), tkaot.rand.randn((4,), dtype=torch.float64, device="cpu")

    x = torch.empty(3, 5, dtype=BF16)
    (gm,) = compiled_graphs(draw, x)
    assert not _tkaot_calls(gm) and sum(n.op == "call_function" for n in gm.graph.nodes) >= 3
    torch._dynamo.reset()
    compiled = torch.compile(draw, fullgraph=True, backend="eager")
    draws = []
    for fn in (compiled, compiled, draw):
        tkaot.rand.set_seed(1234)
        draws.append(fn(x))
    for first, again, eager in zip(*draws):
        assert (first.shape, first.dtype) == (eager.shape, eager.dtype)
        assert torch.equal(first, again) and torch.equal(first, eager)
    assert draws[0][1].shape == x.shape and draws[0][1].dtype == BF16


class DecodeStep(torch.nn.Module):
    def forward(self, state):
        return step(state)


class NormInto(torch.nn.Module):
    """norm_forward writing given buffers, then a cast of its output."""

    def forward(self, x, w, out, residual, residual_out):
        y, rstd, h = tkaot.quant.norm_forward(x, w, 1e-6, residual=residual, out=out, residual_out=residual_out, with_rstd=True)
        return tkaot.quant.per_token_cast(y, "e4m3", 128), rstd, h


def test_torch_export_of_modules_calling_tkaot_ops():
    state = fake_state(3)
    ep = torch.export.export(DecodeStep(), (state,))
    assert len(_tkaot_calls(ep.graph_module)) == 6
    with FakeTensorMode():
        args = tuple(torch.empty(s, dtype=BF16, device="cuda") for s in ((4, 512), (512,), (4, 512), (4, 512), (4, 512)))
    ep = torch.export.export(NormInto(), args)
    assert _tkaot_calls(ep.graph_module) == ["norm_forward", "per_token_cast"]
    assert "norm_forward.o1(x, w, 1e-06, residual, 1.0, out, residual_out, True)" in ep.graph_module.code
    # functionalised (the core ATen IR), the written buffers are the program's mutated inputs
    functional = ep.run_decompositions({})
    mutated = {spec.target for spec in functional.graph_signature.output_specs if spec.kind.name == "USER_INPUT_MUTATION"}
    assert mutated == {"out", "residual_out"}


def test_opcheck_on_meta_tensors():
    """torch.library.opcheck's schema, fake-tensor and AOT-dispatch checks, on meta tensors (the real kernels need CUDA)."""
    _compile.register_all()
    cases = [
        (torch.ops.tkaot.norm_forward.o2, (meta(4, 512), meta(512), 1e-6, None, 1.0, None, None, True)),
        (torch.ops.tkaot.per_token_cast.o2, ([meta(4, 512)], "e4m3", 128, None, True, True, False, False, False, None, None)),
        (torch.ops.tkaot.apply_rotary.o0, (meta(4, 8, 64), meta(64, 64, dtype=F32), None, None, False, False, 0)),
        (torch.ops.tkaot.moe_topk_gate_forward.o0,
         (meta(4, 256, dtype=F32), 8, False, 0, 2.5, 0, "sqrtsoftplus", *[None] * 8, meta(4, 8, dtype=I64), meta(4, 8, dtype=F32), None)),
        (torch.ops.tkaot.mhc_multilayer_recompute.o0, recompute_args(layers=2, post=1)),
        (torch.ops.tkaot.mhc_pre_big_fuse_fwd.o0,
         (f32(16, 5, 24), f32(16, 5), f32(3), f32(24), meta(5, 4, 512), f32(5, 4), f32(5, 16), meta(5, 512), *[1e-6] * 3, 2.0, 20, 16)),
        (torch.ops.tkaot.engram_gate_fwd.o0, (meta(4, 4, 512), meta(4, 5, 512), f32(4, 512), 1e-6, 1e-6, False, None, True)),
        (torch.ops.tkaot.engram_gate_fwd.o5, (meta(4, 4, 512), meta(4, 5, 512), f32(4, 512), 1e-6, 1e-6, True, None, False)),
        (torch.ops.tkaot.engram_sinkhorn_finalize.o0, (f32(64, 512), f32(64), f32(512), 1e-6, 2.0, f32(64, 512))),
        (torch.ops.tkaot.norm_backward.o1, (meta(4, 512), meta(4, 512), meta(512), f32(4), meta(4, 512), 0.5, f32(512))),
        (torch.ops.tkaot.swiglu_backward.o3, (f32(4, 1024), f32(4, 512), "bf16", None, f32(4), 2.5, 7.0, True)),
        (torch.ops.tkaot.swiglu_backward_and_per_token_cast.o5,
         ([meta(4, 1024, dtype=F8), f32(4, 32)], meta(4, 512), "e4m3", 32, meta(2, dtype=I32), f32(4), None, True, True, True, None, True)),
        (torch.ops.tkaot.moe_topk_gate_backward.o0,
         (f32(4, 256), meta(4, 8, dtype=I64), f32(4, 8), f32(4, 8), 2.5, "sqrtsoftplus", meta(4, dtype=torch.bool), f32(2, 256),
          f32(4, 256))),
    ]  # fmt: skip
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_import_registers_nothing():
    code = (
        "import time, torch; t = time.perf_counter(); import tkaot, tkaot.quant, tkaot.moe, tkaot.transform, tkaot.mhc, tkaot.engram; "
        "dt = time.perf_counter() - t; print(sum(n.startswith('tkaot::') for n in torch._C._dispatch_get_all_op_names()), dt)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "0"  # registration waits for an op module's first use
