"""mps_ext: hand-written Metal kernels for PyTorch's ``mps`` device, and a Metal
simulator that runs the same kernels on the CPU (``mps_ext.sim``)."""

import torch  # loads libtorch, which _C links against

from . import _C, sim

__version__ = "0.1.0"

__all__ = ["sim"]
