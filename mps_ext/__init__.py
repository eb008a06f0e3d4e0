"""mps_ext: hand-written Metal kernels for PyTorch's ``mps`` device, and a Metal
simulator that runs the same kernels on the CPU (``mps_ext.sim``).

Importing mps_ext overrides torch ops on ``mps`` tensors with its kernels
(see :mod:`mps_ext.overrides`; ``MPS_EXT_DISABLE=1`` opts out). Its own
functions (``mps_ext.softmax``...) run the kernels on ``mps`` tensors on the GPU
and on CPU tensors in the simulator.
"""

import torch  # loads libtorch, which _C links against

from . import _C, fp8, nn, overrides, sim
from ._ops import grouped_mm, linear, log_softmax, softmax
from ._trace import KernelRecord, trace
from .fp8 import fp8_linear, scaled_mm

__version__ = "0.1.0"

__all__ = ["KernelRecord", "fp8", "fp8_linear", "grouped_mm", "linear", "log_softmax", "nn", "overrides", "scaled_mm", "sim", "softmax",
           "trace"]

overrides.enable_on_import()
