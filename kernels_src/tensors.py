"""Tensor types for prim_func annotations, as factories: an annotation that is a callable is called once per
argument, so arguments sharing one type each get a buffer of their own (and keep their names)."""

import tilelang.language as T


def tensor(dtype, *shape):
    """A tensor type of this dtype and shape."""
    return lambda: T.Tensor[shape, dtype]


def fp32(*shape):
    """A float32 tensor type of this shape."""
    return tensor(T.float32, *shape)
