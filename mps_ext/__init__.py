"""mps_ext: hand-written Metal kernels for PyTorch's ``mps`` device, and a Metal
simulator that runs the same kernels on the CPU (``mps_ext.sim``).

Importing mps_ext overrides torch ops on ``mps`` tensors with its kernels
(see :mod:`mps_ext.overrides`; ``MPS_EXT_DISABLE=1`` opts out). Its own
functions (``mps_ext.softmax``...) run the kernels on ``mps`` tensors on the GPU
and on CPU tensors in the simulator.
"""

from ._load import load_extension

_C = load_extension()

from . import _compile, fp8, nn, overrides, sim  # noqa: E402 (they need _C)
from ._ops import grouped_mm, linear, log_softmax, scaled_dot_product_attention, softmax
from ._ops import householder_product, inv, inv_ex, lu_factor, lu_factor_ex, lu_solve, qr, solve, solve_ex, solve_triangular
from ._trace import KernelRecord, trace
from .fp8 import fp8_grouped_mm, fp8_linear, scaled_mm
from . import _vmap  # noqa: E402,F401 (batching rules of the operators above)
from . import _autocast  # noqa: E402,F401 (their autocast)
from .streams import Event, Stream, current_stream, default_stream, record_stream, set_stream, stream, synchronize
from . import _transformers  # noqa: E402

_transformers.install()  # attn_implementation="mps_ext"

__version__ = "0.1.0"

__all__ = ["KernelRecord", "linear", "log_softmax", "overrides", "sim", "softmax", "trace"]
__all__ += ["householder_product", "inv", "inv_ex", "lu_factor", "lu_factor_ex", "lu_solve", "qr", "solve", "solve_ex",
            "solve_triangular"]
__all__ += ["Event", "Stream", "current_stream", "default_stream", "record_stream", "set_stream", "stream",
            "synchronize"]
__all__ += ["fp8", "fp8_grouped_mm", "fp8_linear", "nn", "scaled_mm"]
__all__ += ["grouped_mm", "scaled_dot_product_attention"]

_compile.install()  # torch.compile keeps the overridden ops (see mps_ext/_compile.py)
overrides.enable_on_import()
