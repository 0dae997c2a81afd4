"""TileLang sources of tkaot's kernels.

Each module under a family folder describes one kernel: its static axes
(`AXES`), its dynamic dims (`DYNAMIC_DIMS`) and `build(**static)`, which
returns a TileLang PrimFunc. Only the build pipeline imports these modules.
"""
