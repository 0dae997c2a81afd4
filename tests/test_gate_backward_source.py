"""moe_topk_gate_backward's generated CUDA, read on the CPU (real TileLang lowering): every full-mask warp intrinsic
(shuffle, match, vote, __syncwarp) is reached by every lane of the warp, and rows move in 16-byte accesses.

A full-mask intrinsic that some lane skips hangs the warp (session 12's first build: a __match_any_sync behind
`idx >= 0 &&`, skipped by the lanes of empty slots). So each one may sit only behind branches uniform over a warp:
on the token (one a warp), the aux flag, the slot count, or a vote's result, and never after a short-circuit or a
conditional on its own line."""

from __future__ import annotations

import re

import pytest

from build_tools.compile import lower_checked
from build_tools.ops import Variant
from tkaot._moe.kernels import MOE_GATE_BWD_TILINGS

FULL_MASK = re.compile(r"__shfl\w*|__match_any_sync|__any_sync|__all_sync|__ballot_sync|__syncwarp|tkaot_any_repeated|tkaot_sync_warp")
# What varies across a warp's lanes: the lane itself and the per-lane values of the kernel
LANE_VALUES = re.compile(r"threadIdx|\b(idx|u|h|u_k|g_k|w_k|r_k|r_sum|r_other|other|last|dot|topk_sum|u_sum|aux_dot|dv|uv|gv)\b")


@pytest.fixture(scope="module")
def source() -> str:
    variant = Variant.make("moe_topk_gate_backward", {"tiling": MOE_GATE_BWD_TILINGS["default"]})
    return lower_checked(variant, "sm90")[1]


def guarded_calls(text: str) -> list[tuple[str, list[str]]]:
    """(line, the conditions of the `if`s around it) for every line of `text` that calls a full-mask intrinsic."""
    found, stack = [], []
    for line in text.splitlines():
        t = line.strip()
        if t.startswith("}"):
            closed = stack.pop() if stack else None
            if t.endswith("{"):  # } else {: uniform exactly when its `if` is
                stack.append(closed)
            continue
        opened = re.match(r"if \((.*)\) \{$", t)
        if FULL_MASK.search(t):
            found.append((t, [c for c in stack if c]))
        if opened:
            stack.append(opened.group(1))
        elif t.endswith("{"):
            stack.append(None)
    return found


def uniform(condition: str) -> bool:
    """Whether a condition of the kernel is the same for every lane of a warp."""
    c = condition.replace("(((int)threadIdx.x) >> 5)", "WARP").replace("tkaot_any_repeated(idx)", "VOTE")
    return not LANE_VALUES.search(c)


def test_every_full_mask_intrinsic_is_behind_uniform_branches_only(source):
    kernel = source[source.index("__launch_bounds__") :]
    calls = guarded_calls(kernel)
    assert len(calls) >= 6  # the warp sums, the slot loop's shuffles, the vote, the two __syncwarp
    for line, conditions in calls:
        assert all(uniform(c) for c in conditions), (line, conditions)
    # and none after a short-circuit or a conditional on its own line, in the kernel or its helpers
    for line in source.splitlines():
        call = FULL_MASK.search(line)
        if call and "__device__" not in line:
            assert not re.search(r"&&|\|\||\?", line[: call.start()]), line


def test_rows_move_in_16_byte_accesses(source):
    kernel = source[source.index("__launch_bounds__") :]
    for helper in ("tkaot_load4", "tkaot_store4", "tkaot_row_put4", "tkaot_row_get4"):
        assert helper + "(" in kernel
    assert "float4" in source[: source.index("__launch_bounds__")]


def test_the_aux_row_is_read_in_the_lanes_vectors(source):
    """h, like the scores, in 16-byte loads of the lane's vectors (experts 128c + 4 lane + j) where rows are aligned,
    element by element in the same layout where not: no strided access (experts lane + 32i) is left."""
    kernel = source[source.index("__launch_bounds__") :]
    loads = [line for line in kernel.splitlines() if "tkaot_load4(" in line]
    assert sum("grad_scores_sum[" in line for line in loads) == 1  # in the loop over a lane's vectors
    assert sum("scores[" in line.replace("grad_scores_sum[", "") for line in loads) == 1
    accesses = re.findall(r"grad_scores_sum\[([^\]]*)\]", kernel)
    assert len(accesses) == 2  # the vector's load and the element path's
    for index in accesses:
        assert "(int64_t)128)" in index and "(int64_t)4)" in index and not re.search(r"\b32\b", index), index


def test_the_check_sees_a_lane_dependent_branch():
    bad = "if (idx >= 0) {\n  y = 0;\n} else {\n  x = __shfl_sync(4294967295u, y, 0, 32);\n}\n"
    ((line, conditions),) = guarded_calls(bad)
    assert conditions == ["idx >= 0"] and not uniform(conditions[0])
    assert uniform("((((int)blockIdx.x) * 4) + (((int)threadIdx.x) >> 5)) < num_tokens") and uniform("k < num_topk")
