"""Model configs -> shape-set tables: the mapping lives in the runtime (tkaot/_model_shapes.py) so that
`tkaot-build check` runs without the build extra; the build reads it from here, beside the preset configs."""

from pathlib import Path

from tkaot._model_shapes import (  # noqa: F401
    GATE_TILING,
    MAPPINGS,
    NORM_CAST_RESIDUAL_TILING,
    NORM_CAST_TILING,
    SWIGLU_CLAMP_TILING,
    SWIGLU_TILING,
    ModelConfig,
    NeededVariant,
    linear_inputs,
    load_config,
    mapping,
    mlp_widths,
    needed_variants,
    norm_widths,
    shape_tables,
    static_keys,
)

CONFIGS_DIR = Path(__file__).resolve().parent / "model_configs"  # the presets' public configs
