"""What tkaot.quant's fused ops share: the kernel tilings they launch, the output dtypes.

The ops live in tkaot/_quant/swiglu.py (swiglu_forward, swiglu_forward_and_per_token_cast) and
tkaot/_quant/norm_cast.py (norm_forward_and_per_token_cast); tkaot.quant loads each on first use.
They read SWIGLU_TILING (SWIGLU_CLAMP_TILING for calls with a clamp_value) and NORM_CAST_TILING
(NORM_CAST_RESIDUAL_TILING for calls with a residual) from this module at every call (the tiling is part
of their launcher cache key), so a benchmark that sets them here (bench/tuning/tune_fused.py,
bench/tuning/profile_fused.py) changes the variant the next call launches.

Scale-factor conventions (TileKernels 2.1.0): one sf per group of
`num_per_channels` outputs of a row, dequantising (value = stored * sf);
`round_sf` rounds it up to a power of two; `use_packed_ue8m0` stores those
powers of two as exponent bytes, four to an int32; the TMA-aligned layout is
column-major with the token dimension padded to 16 bytes.
"""

from __future__ import annotations

import torch

from tkaot._quant.kernels import NORM_CAST_TILINGS, SWIGLU_TILINGS

# The shipped tilings, declared with the kernels (tkaot/_quant/kernels.py)
SWIGLU_TILING = SWIGLU_TILINGS["default"]
SWIGLU_CLAMP_TILING = SWIGLU_TILINGS["clamp"]  # calls with a clamp_value
NORM_CAST_TILING = NORM_CAST_TILINGS["default"]
NORM_CAST_RESIDUAL_TILING = NORM_CAST_TILINGS["residual"]  # calls with a residual

_F32, _I32, _BF16, _FP8 = torch.float32, torch.int32, torch.bfloat16, torch.float8_e4m3fn
_empty_strided = torch.empty_strided
