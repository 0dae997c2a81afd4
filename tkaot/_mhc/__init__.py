"""The ops behind tkaot.mhc (Manifold-Constrained Hyper-Connections): declarations in kernels.py, one module per op group."""
