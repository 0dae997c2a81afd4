"""MoE routing kernels: score, top-k select and weight the experts of each token."""
