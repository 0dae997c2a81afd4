"""TileLang sources of tkaot's kernels.

Each module under a family folder builds one declared kernel: `DECL` names its
declaration (tkaot/_<family>/kernels.py: static axes, runtime arguments,
dynamic dims, shipped tilings, ops), and `build(**static)` returns a TileLang
PrimFunc for one value of each axis. Only the build pipeline imports these
modules; the build checks each lowered kernel against its declaration.
"""
