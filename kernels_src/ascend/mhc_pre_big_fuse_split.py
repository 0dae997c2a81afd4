"""mHC pre-layer step, fused, for Ascend: the declaration of the CUDA split form (kernels_src/mhc/pre_big_fuse_split.py,
several blocks a token, which the op launches for few tokens) served by the Ascend kernel of one block a token
(kernels_src/ascend/mhc_pre_big_fuse.py): the same arguments and outputs, so the op needs no Ascend case of its own.
"""

from kernels_src.ascend.mhc_pre_big_fuse import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_pre_big_fuse import build as build
from kernels_src.ascend.mhc_pre_big_fuse import unsupported as unsupported
from tkaot._mhc.kernels import PRE_BIG_FUSE_SPLIT

DECL = PRE_BIG_FUSE_SPLIT
