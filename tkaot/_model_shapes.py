"""Model configs (Hugging Face `config.json`) -> the shape-set tables a model's forward pass needs.

Each kernel that can be derived from a model registers one mapping:

    @mapping("rmsnorm")
    def rmsnorm_tables(model: ModelConfig) -> list[dict]:
        return [{"hidden": [...], "dtype": [...], ...}]

A mapping returns tables exactly like a shape-set TOML's `[[kernel]]` tables
and names *every* static axis of its kernel, in the declaration's order
(tkaot/_decl.py; a test holds every mapping to that). `needed_variants` expands
them and sorts each variant into buildable or unsupported by the declaration's
axes: the one rule `tkaot-build check` and `tkaot-build build --hf-config` share.

This module reads JSON and the plain-data declarations, nothing else: no TileLang,
no build_tools, so `tkaot-build check` works where only the runtime is installed.
Mappings read `ModelConfig`'s normalised fields, never the raw dict's aliases.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tkaot._decl import all_kernels, format_value
from tkaot._mhc.kernels import pre_apply_mix_bwd_tiling
from tkaot._moe.kernels import GATE_TILINGS
from tkaot._quant.kernels import NORM_CAST_TILINGS, SWIGLU_TILINGS

ShapeTables = list[dict[str, list]]

# model_type values whose attention applies RMSNorm to every query and key head (over head_dim)
PER_HEAD_QK_NORM = frozenset({"qwen3", "qwen3_moe", "qwen3_next", "gemma3", "gemma3_text"})


# The fields read for a model's mHC expansion rate, first found wins: `hc_mult` (the hyper-connection count of
# DeepSeek's mHC models) or TileKernels' own name for it. Hidden size and token count are runtime values of every
# mHC kernel, so the rate alone decides their variants.
HC_MULT_FIELDS = ("hc_mult", "mhc_mult")


def _positive_int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _first(config: dict, *names: str, default=None):
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default


@dataclass(frozen=True)
class ModelConfig:
    """The fields of a model config that decide kernel shapes, under one name each."""

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int | None
    moe_intermediate_size: int | None
    num_experts: int | None  # routed experts; None for a dense model
    experts_per_token: int | None
    n_group: int | None
    topk_group: int | None
    num_attention_heads: int | None
    num_key_value_heads: int | None
    head_dim: int | None
    rope_head_dim: int | None  # dims each head rotates
    q_lora_rank: int | None  # MLA: None when queries are not low-rank (DeepSeek-V2-Lite)
    kv_lora_rank: int | None
    qk_norm: bool  # RMSNorm on every query and key head
    hc_mult: int | None = None  # mHC expansion rate (hyper-connection streams); None without mHC
    raw: dict = field(repr=False, compare=False, default_factory=dict)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @classmethod
    def from_dict(cls, config: dict, name: str = "model") -> ModelConfig:
        # multimodal configs nest the language model under text_config
        config = {**config, **config.get("text_config", {})}
        hidden = config.get("hidden_size")
        if not isinstance(hidden, int) or hidden <= 0:
            raise ValueError(f"{name}: no positive integer hidden_size; is this a Hugging Face model config.json?")
        heads = config.get("num_attention_heads")
        head_dim = _first(config, "head_dim", default=hidden // heads if heads else None)
        rope = config.get("qk_rope_head_dim")
        if rope is None and head_dim is not None:
            rope = int(head_dim * config.get("partial_rotary_factor", 1.0))
        model_type = str(config.get("model_type", ""))
        return cls(
            name=name,
            model_type=model_type,
            hidden_size=hidden,
            intermediate_size=config.get("intermediate_size"),
            moe_intermediate_size=config.get("moe_intermediate_size"),
            num_experts=_first(config, "n_routed_experts", "num_experts", "num_local_experts"),
            experts_per_token=_first(config, "num_experts_per_tok", "moe_topk"),
            n_group=config.get("n_group"),
            topk_group=config.get("topk_group"),
            num_attention_heads=heads,
            num_key_value_heads=_first(config, "num_key_value_heads", default=heads),
            head_dim=head_dim,
            rope_head_dim=rope,
            q_lora_rank=config.get("q_lora_rank"),
            kv_lora_rank=config.get("kv_lora_rank"),
            qk_norm=bool(config.get("use_qk_norm")) or model_type in PER_HEAD_QK_NORM,
            hc_mult=_positive_int(_first(config, *HC_MULT_FIELDS)),
            raw=config,
        )


def load_config(path: str | Path) -> ModelConfig:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read model config {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a model config is a JSON object")
    # a downloaded config is always "config.json": name the model by its hub id when it has one
    name = data.get("_name_or_path") or (data.get("text_config") or {}).get("_name_or_path") or str(path)
    return ModelConfig.from_dict(data, name=str(name))


MAPPINGS: dict[str, Callable[[ModelConfig], ShapeTables]] = {}


def mapping(kernel: str):
    """Register `fn(ModelConfig) -> tables` as the shapes `kernel` needs for a model."""

    def register(fn: Callable[[ModelConfig], ShapeTables]) -> Callable[[ModelConfig], ShapeTables]:
        if kernel in MAPPINGS:
            raise RuntimeError(f"two model-shape mappings for kernel {kernel!r}")
        MAPPINGS[kernel] = fn
        return fn

    return register


def shape_tables(model: ModelConfig) -> dict[str, ShapeTables]:
    """{kernel: tables} for every kernel with both a mapping and a declaration."""
    declared = all_kernels()
    out: dict[str, ShapeTables] = {}
    for kernel, fn in sorted(MAPPINGS.items()):
        if kernel not in declared:
            continue  # the kernel is not written yet: nothing to build for it
        tables = [t for t in fn(model) if all(t.values())]
        if tables:
            out[kernel] = tables
    return out


@dataclass(frozen=True)
class NeededVariant:
    """One variant a model needs: buildable when `reason` is None, else unsupported and why."""

    kernel: str
    key: str
    values: tuple  # static values in the declaration's axis order
    reason: str | None = None

    @property
    def static(self) -> frozenset:
        """{(axis, value text)}: how a manifest entry's "static" compares with it."""
        return frozenset(zip(all_kernels()[self.kernel].axis_names, map(format_value, self.values)))

    @property
    def params(self) -> dict:
        return dict(zip(all_kernels()[self.kernel].axis_names, self.values))


# What a user can do about a variant no kernel builds, beyond the op falling back to its caller
UNSUPPORTED_ADVICE = {
    "moe_topk_gate": (
        "keep your framework's router for this gate, or pick the top-k of scores you compute with tkaot.moe.topk_gate "
        "(any expert count up to 512)"
    ),
}
DEFAULT_ADVICE = "keep these calls on your framework's own implementation; tkaot's op would raise VariantNotBuilt"


def advice(kernel: str) -> str:
    return UNSUPPORTED_ADVICE.get(kernel, DEFAULT_ADVICE)


def needed_variants(tables: dict[str, ShapeTables]) -> list[NeededVariant]:
    """Every variant the tables expand to, each judged by its kernel's declared axes (`Axis.validate`).

    The one rule for "can tkaot build this": `check` reports an unsupported variant
    with its reason instead of calling it missing, and `build --hf-config` skips it
    with the same line.
    """
    import itertools

    declared = all_kernels()
    found: dict[tuple[str, str], NeededVariant] = {}
    for kernel, kernel_tables in tables.items():
        decl = declared[kernel]
        for table in kernel_tables:
            if tuple(table) != decl.axis_names:
                raise ValueError(f"the {kernel} mapping must name every axis in order {decl.axis_names}, not {tuple(table)}")
            for values in itertools.product(*(v if isinstance(v, list) else [v] for v in table.values())):
                reason = None
                for axis, value in zip(decl.axes, values):
                    try:
                        axis.validate(value)
                    except ValueError as exc:
                        reason = str(exc)
                        break
                key = decl.key(values)
                found.setdefault((kernel, key), NeededVariant(kernel, key, tuple(values), reason))
    return [found[k] for k in sorted(found)]


def static_keys(tables: dict[str, ShapeTables]) -> dict[tuple[str, frozenset], str]:
    """{(kernel, frozenset of (axis, value text)): key text} for every variant the tables expand to, buildable or not."""
    return {(v.kernel, v.static): v.key for v in needed_variants(tables)}


# --- rmsnorm -----------------------------------------------------------------

NORM_DTYPES = ["bfloat16", "float32"]
BOTH = [False, True]


def norm_widths(model: ModelConfig) -> list[int]:
    """The width of every RMSNorm the model applies."""
    widths = {model.hidden_size}  # input/post-attention layer norms and the final norm
    if model.qk_norm and model.head_dim:
        widths.add(model.head_dim)  # q_norm / k_norm over each head
    if model.q_lora_rank:
        widths.add(model.q_lora_rank)  # MLA q_a_layernorm
    if model.kv_lora_rank:
        widths.add(model.kv_lora_rank)  # MLA kv_a_layernorm
    return sorted(widths)


@mapping("rmsnorm")
def rmsnorm_tables(model: ModelConfig) -> ShapeTables:
    # Like the default set: both dtypes, every weight/residual/rstd combination,
    # so norm_forward's options (fused residual, training's rstd) all hit a variant.
    return [
        {
            "hidden": norm_widths(model),
            "dtype": NORM_DTYPES,
            "with_weight": BOTH,
            "with_residual": BOTH,
            "with_rstd": BOTH,
        }
    ]


# --- the other kernels --------------------------------------------------------
# The shipped tilings, from the kernels' declarations (the ones the ops launch)
SWIGLU_TILING, SWIGLU_CLAMP_TILING = SWIGLU_TILINGS["default"], SWIGLU_TILINGS["clamp"]
NORM_CAST_TILING, NORM_CAST_RESIDUAL_TILING = NORM_CAST_TILINGS["default"], NORM_CAST_TILINGS["residual"]
GATE_TILING = GATE_TILINGS["default"]
FP8_SF = ["fp32", "pow2", "ue8m0"]  # plain, power-of-two and packed-UE8M0 scale factors (DeepGEMM)


def linear_inputs(model: ModelConfig) -> list[int]:
    """Widths of the activations entering the model's linear layers (what FP8 GEMMs cast)."""
    widths = {model.hidden_size}  # q/kv/gate/up projections, and o_proj's output side is hidden too
    for width in (model.intermediate_size, model.moe_intermediate_size, model.q_lora_rank, model.kv_lora_rank):
        if width:
            widths.add(width)  # down projections; MLA's q_b / kv_b projections
    if model.num_attention_heads and model.head_dim and not model.is_mla:
        widths.add(model.num_attention_heads * model.head_dim)  # o_proj input
    return sorted(w for w in widths if w % 128 == 0)  # per-token groups of 128 channels


def mlp_widths(model: ModelConfig) -> list[int]:
    """Intermediate sizes of the model's gated MLPs (dense and expert) that the SwiGLU kernel takes."""
    return sorted({w for w in (model.intermediate_size, model.moe_intermediate_size) if w and w % 256 == 0})


@mapping("per_token_cast")
def per_token_cast_tables(model: ModelConfig) -> ShapeTables:
    # FP8 inference: e4m3 with 128-channel groups, row- or TMA-aligned column-major sf
    return [
        {
            "hidden": linear_inputs(model),
            "in_dtype": ["bfloat16"],
            "in_block": ["none"],
            "in_sf": ["none"],
            "fmt": ["e4m3"],
            "group": [128],
            "sf": FP8_SF,
            "sf_layout": ["row", "col"],
            "mode": ["cast"],
            "stochastic": [False],
        }
    ]


@mapping("swiglu")
def swiglu_tables(model: ModelConfig) -> ShapeTables:
    widths = mlp_widths(model)
    common = {"hidden": widths, "dtype": ["bfloat16"]}
    return [
        {**common, "fmt": ["bf16"], "group": [0], "sf": ["none"], "tiling": [SWIGLU_TILING, SWIGLU_CLAMP_TILING]},
        {**common, "fmt": ["e4m3"], "group": [128], "sf": FP8_SF, "tiling": [SWIGLU_TILING, SWIGLU_CLAMP_TILING]},
    ]


@mapping("norm_cast")
def norm_cast_tables(model: ModelConfig) -> ShapeTables:
    # RMSNorm fused with the per-token cast (groups of 32) of the next linear layer's input
    widths = [w for w in norm_widths(model) if w % 32 == 0 and w <= 8192]
    return [{"hidden": widths, "dtype": ["bfloat16"], "sf": FP8_SF, "tiling": [NORM_CAST_TILING, NORM_CAST_RESIDUAL_TILING]}]


@mapping("rotary")
def rotary_tables(model: ModelConfig) -> ShapeTables:
    rot = [model.rope_head_dim] if model.rope_head_dim in (64, 128) else []
    return [{"rot_dim": rot, "dtype": ["bfloat16"], "interleaved": BOTH}]


@mapping("moe_topk_gate")
def moe_gate_tables(model: ModelConfig) -> ShapeTables:
    if not model.num_experts or not model.experts_per_token:
        return []  # a dense model routes nothing
    return [{"num_experts": [model.num_experts], "num_topk": [model.experts_per_token], "tiling": [GATE_TILING]}]


@mapping("topk_gate")
def topk_gate_tables(model: ModelConfig) -> ShapeTables:
    if not model.num_experts or not model.experts_per_token:
        return []
    tables = [{"num_experts": [model.num_experts], "num_topk": [model.experts_per_token], "tiling": [GATE_TILING]}]
    if model.n_group and model.topk_group:  # group-limited routing picks groups first
        tables.append({"num_experts": [model.n_group], "num_topk": [model.topk_group], "tiling": [GATE_TILING]})
    return tables


@mapping("normalize_weight")
def normalize_weight_tables(model: ModelConfig) -> ShapeTables:
    return [{"num_topk": [model.experts_per_token]}] if model.num_experts and model.experts_per_token else []


# mHC (tkaot/_mhc/kernels.py): the kernels that keep (mhc_mult x ...) tiles in registers are specialised on the
# expansion rate (the pre-apply mix backward also on its tiling); the others on nothing but their float32 dtype
def mhc_tables(model: ModelConfig) -> ShapeTables:
    return [{"mhc_mult": [model.hc_mult]}] if model.hc_mult else []


def mhc_f32_tables(model: ModelConfig) -> ShapeTables:
    return [{"dtype": ["float32"]}] if model.hc_mult else []


@mapping("mhc_pre_apply_mix_bwd")
def mhc_pre_apply_mix_bwd_tables(model: ModelConfig) -> ShapeTables:
    # the tiling the op launches at the model's hidden size
    return [{"mhc_mult": [model.hc_mult], "tiling": [pre_apply_mix_bwd_tiling(model.hidden_size)]}] if model.hc_mult else []


for _kernel in (
    "mhc_expand_fwd", "mhc_expand_bwd", "mhc_pre_apply_mix_fwd", "mhc_split_mixes_fwd",
    "mhc_split_mixes_bwd", "mhc_split_mixes_bwd_reduce", "mhc_sinkhorn_fwd", "mhc_sinkhorn_bwd", "mhc_post_fwd", "mhc_post_bwd",
    "mhc_pre_big_fuse", "mhc_pre_big_fuse_split", "mhc_multilayer_recompute",
):  # fmt: skip
    mapping(_kernel)(mhc_tables)
for _kernel in (
    "mhc_head_mix_fwd", "mhc_head_mix_bwd", "mhc_normw_merge_fwd", "mhc_normw_merge_bwd", "mhc_reduce_partials_fwd",
    "mhc_reduce_partials_bwd",
):  # fmt: skip
    mapping(_kernel)(mhc_f32_tables)
