"""The last step of the row-wise casts: a vector of scaled fp32 values rounded to the output format and stored.

The output buffer's storage type says the format: float8_e4m3 holds one value an
element; uint32 (uint16) words hold eight (four) packed E2M1 codes.
"""

import tilelang.language as T

from kernels_src.quant import common


@T.macro
def store_encoded(xf, o_reg, out, row, col):
    """xf (fp32, already scaled) rounded into o_reg and stored at out[row, ...] from input column col."""
    word_codes = 8 if o_reg.dtype == "uint32" else 4
    if o_reg.dtype in ("uint32", "uint16"):
        for w in T.unroll(o_reg.shape[0]):
            o_reg[w] = common.pack_e2m1([common.e2m1_code(xf[w * word_codes + n]) for n in range(word_codes)], o_reg.dtype)
    else:
        for j in T.vectorized(o_reg.shape[0]):
            o_reg[j] = common.to_e4m3(xf[j])
    for j in T.vectorized(o_reg.shape[0]):
        out[row, col // (word_codes if o_reg.dtype in ("uint32", "uint16") else 1) + j] = o_reg[j]
