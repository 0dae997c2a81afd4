"""Tiling candidates of the row-wise cast kernels, for measuring on a GPU (bench/tuning/tune_quant.py); serves no op.

Not a declared kernel, so `tkaot-build` no longer builds it: call build() from a TileLang session.

Each `case` is one kernel at one static key (hidden 7168, bf16 or E4M3 input);
`tiling` picks one of its candidate tilings (c0 is the kernel's default, the one
its op launches; the FP4 cases have two, the others four). Only built on request
(no shape set names it); the launch arguments are those of the kernel the case builds.
"""

from kernels_src.quant import cast_back, per_channel_cast, per_token_cast
from kernels_src.quant.tiling import RowTiling
from tkaot._decl import Axis

KERNEL = "cast_tune"
OPS = ()

_PTC = dict(hidden=7168, in_dtype="bfloat16", in_block="none", in_sf="none", sf_layout="row", mode="cast", stochastic=False)
# h = CTAs walk along the rows, s = one lane forms each group's scale (tiling.RowTiling); the e4m3 op ships c1
_PTC_TILINGS = {"c0": "t128r4c1", "c1": "t128r4c1h", "c2": "t128r4c1s", "c3": "t128r4c1hs"}
# FP4: c0 ships (TILING_E2M1_BF16: the fp4_words helpers, eight codes a call, and no token checks in CTAs whose
# tokens are all in range), c1 is the expression path other e2m1 variants take (TILING_E2M1). FP4 run 3's other
# candidates (the helpers with every CTA checked, the group amax scattered over lanes) lost and left per_token_cast;
# their times stay in the tuning logs.
_FP4_TILINGS = {"c0": "t128r4c1sf", "c1": "t128r4c1s"}
CASES = {
    # case -> (kernel module, static params, tiling candidates)
    "ptc_e4m3_128": (per_token_cast, dict(_PTC, fmt="e4m3", group=128, sf="fp32"), _PTC_TILINGS),
    "ptc_e4m3_128_ue8m0_col": (per_token_cast, dict(_PTC, fmt="e4m3", group=128, sf="ue8m0", sf_layout="col"), _PTC_TILINGS),
    "ptc_e2m1_32": (per_token_cast, dict(_PTC, fmt="e2m1", group=32, sf="fp32"), _FP4_TILINGS),
    "ptc_e2m1_32_ue8m0": (per_token_cast, dict(_PTC, fmt="e2m1", group=32, sf="ue8m0"), _FP4_TILINGS),
    "cast_back_e4m3_128": (
        cast_back,
        dict(hidden=7168, in_dtype="e4m3", in_block="1x128", in_sf="fp32", out_dtype="bfloat16"),
        {"c0": "t128r4c1h", "c1": "t128r8c1h", "c2": "t128r8c1v8h", "c3": "t128r4c1v8h"},
    ),
    "per_channel_128": (
        per_channel_cast,
        dict(hidden=7168, in_dtype="bfloat16", in_block="none", in_sf="none", block_m=128, sf="fp32"),
        {"c0": (256, 8), "c1": (512, 16), "c2": (256, 16), "c3": (256, 32)},
    ),
}

AXES = (Axis("case", str, choices=tuple(CASES)), Axis("tiling", str, choices=("c0", "c1", "c2", "c3")))
DYNAMIC_DIMS = ("num_tokens",)


def tiling_of(case: str, tiling: str):
    """The tiling object candidate `tiling` of `case` stands for."""
    candidates = CASES[case][2]
    if tiling not in candidates:
        raise ValueError(f"cast_tune: case {case} has candidates {sorted(candidates)}, not {tiling}")
    value = candidates[tiling]
    return RowTiling.parse(value) if isinstance(value, str) else value


def build(case, tiling):
    module, params, _ = CASES[case]
    return module.build(**params, tiling=tiling_of(case, tiling))
