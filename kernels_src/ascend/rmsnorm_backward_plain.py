"""RMSNorm backward, pass 1, for Ascend: the declaration of the CUDA kernel for the calls with neither a weight nor a
residual gradient (kernels_src/norm/rmsnorm_backward_plain.py) served by the Ascend rmsnorm_backward kernel, which takes
both as runtime flags (kernels_src/ascend/rmsnorm_backward.py): the same arguments and outputs.
"""

from kernels_src.ascend.rmsnorm_backward import REQUIRES as REQUIRES
from kernels_src.ascend.rmsnorm_backward import build as build
from kernels_src.ascend.rmsnorm_backward import unsupported as unsupported
from tkaot._quant.kernels import RMSNORM_BACKWARD_PLAIN

DECL = RMSNORM_BACKWARD_PLAIN
