"""mHC multi-layer recompute for Ascend: the residual streams and layer inputs of consecutive layers, rebuilt from
the first residual, the saved mixes and the layer outputs (as kernels_src/mhc/multilayer_recompute.py):
  layer_input[l][t, :] = bf16(the sum over i of pre[l][t, i] * res[i, :])
  residual[l][t, o, :] = bf16(post[l][t, o] * out[l][t, :] + the sum over i of comb[l][t, i, o] * res[i, :])
after which res = residual[l]; res starts as initial_residual, and for num_post < num_layers the last layer
only gets its layer_input. The per-layer tensors come as the op's table of addresses (pointer_table).

One token's (mhc, span) segment of the streams stays in the Unified Buffer through every layer: per layer the
block reads the layer output's segment, mixes the layer input and then, in place, the next streams
(kernels_src/ascend/mhc_common.py mix_streams and post_streams, the mixes read from global memory), and sends both
out.
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from tkaot._mhc.kernels import MULTILAYER_RECOMPUTE

DECL = MULTILAYER_RECOMPUTE


def build(mhc_mult: int):
    m = mhc_mult
    a = mc.Args(m)
    cols = mc.span(2 * (m + 2))
    table_size = T.dynamic("table_size")

    @T.prim_func
    def mhc_multilayer_recompute(
        initial_residual: a.streams, pointer_table: T.Tensor[(table_size,), T.ptr], num_layers: T.int32, num_post: T.int32
    ):
        with T.Kernel(mc.segment_grid(a, cols)) as block:
            t, first = mc.segment_of(block, a, cols)
            res_ub = T.alloc_shared((m, cols), T.bfloat16)
            lo_ub = T.alloc_shared((cols,), T.bfloat16)
            li_ub = T.alloc_shared((cols,), T.bfloat16)
            T.copy(initial_residual[t, :, first : first + cols], res_ub)
            for layer in T.serial(num_layers):
                # the table: pre_mix[0..L), layer_input[0..L), residual[0..P), layer_output[0..P), post_mix[0..P), comb_mix[0..P)
                pre = T.make_tensor(pointer_table[layer], (a.num_tokens, m), T.float32)
                layer_input = T.make_tensor(pointer_table[num_layers + layer], (a.num_tokens, a.hidden), T.bfloat16)
                mc.mix_streams(li_ub, res_ub, lambda i: pre[t, i], cols, m)  # noqa: B023 (called at once)
                if layer < num_post:
                    residual = T.make_tensor(pointer_table[2 * num_layers + layer], (a.num_tokens, m, a.hidden), T.bfloat16)
                    output = T.make_tensor(pointer_table[2 * num_layers + num_post + layer], (a.num_tokens, a.hidden), T.bfloat16)
                    post = T.make_tensor(pointer_table[2 * num_layers + 2 * num_post + layer], (a.num_tokens, m), T.float32)
                    comb = T.make_tensor(pointer_table[2 * num_layers + 3 * num_post + layer], (a.num_tokens, m, m), T.float32)
                    T.copy(output[t, first : first + cols], lo_ub)
                    mc.post_streams(res_ub, res_ub, lo_ub, post, comb, t, cols, m)
                    T.copy(res_ub, residual[t, :, first : first + cols])
                T.copy(li_ub, layer_input[t, first : first + cols])

    return mhc_multilayer_recompute
