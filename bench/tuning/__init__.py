"""Tuning harnesses: the measurements behind the shipped tilings, kept out of the product.

Their candidates other than the shipped tilings were deleted from kernels_src (each kernel keeps one
line of why its tiling won); building them again needs the kernel sources of commit 46d55b4.
"""
