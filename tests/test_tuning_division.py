"""The division of bench/tuning/mhc6_candidates.py's ".fdiv" Sinkhorn candidates (the fast path of IEEE division on a
reciprocal refined once, kept to operands whose biased exponent lies in [67, 187]) against IEEE division, emulated on
CPU with exact fp32 fused multiply-adds; no TileLang or GPU needed."""

import numpy as np

from tests.test_fused_build import _fma32

LOW, HIGH = 67, 187  # the biased exponents tkaot_div_in_range admits


def _in_range(x):
    """tkaot_div_in_range on fp32 bit patterns: ((bits >> 23) & 0xff) - 67 <= 120 as unsigned 32-bit."""
    e = (x.view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)
    return (e - np.uint32(LOW)) <= np.uint32(HIGH - LOW)  # wraps below LOW, as the CUDA does


def _estimates(b):
    """Both fp32 neighbours of 1 / b (rcp.approx's estimate is under 1 ulp off, so it is one of them)."""
    exact = 1.0 / b.astype(np.float64)
    near = exact.astype(np.float32)
    other = np.where(near.astype(np.float64) > exact, np.nextafter(near, np.float32(0)), np.nextafter(near, np.float32(np.inf)))
    return near, other


def _quotient(a, b, r0):
    r = _fma32(r0, _fma32(-b, r0, 1.0), r0)  # tkaot_rcp_refined
    q = (a.astype(np.float64) * r.astype(np.float64)).astype(np.float32)  # __fmul_rn
    return _fma32(_fma32(-b, q, a), r, q)  # tkaot_quotient


def test_range_check_admits_exactly_the_binades_it_names():
    bits = np.arange(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)  # every exponent, both signs
    x = bits.view(np.float32)
    e = (bits >> 23) & 0xFF
    assert np.array_equal(_in_range(x), (e >= LOW) & (e <= HIGH))


def test_fast_path_is_ieee_division_on_admitted_operands():
    """Random operand pairs across the admitted binades, both signs, and pairs where one operand's mantissa is all
    ones (the hardest reciprocals), with either reciprocal estimate: every quotient equals RN(a / b)."""
    rng = np.random.default_rng(6)
    n = 1 << 19

    def operands(mantissa=None):
        m = rng.integers(0, 1 << 23, n, dtype=np.uint32) if mantissa is None else np.uint32(mantissa)
        x = (m | (rng.integers(LOW, HIGH + 1, n, dtype=np.uint32) << np.uint32(23))).view(np.float32)
        return np.where(rng.random(n) < 0.5, -x, x).astype(np.float32)

    for a, b in ((operands(), operands()), (operands(), operands(0x7FFFFF)), (operands(0x7FFFFF), operands())):
        assert _in_range(a).all() and _in_range(b).all()
        want = (a.astype(np.float64) / b.astype(np.float64)).astype(np.float32)
        for r0 in _estimates(b):
            assert np.array_equal(_quotient(a, b, r0).view(np.uint32), want.view(np.uint32))
