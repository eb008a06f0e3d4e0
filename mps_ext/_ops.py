"""The Python API of mps_ext's ops, with torch's semantics and autograd."""

from __future__ import annotations

import operator

import torch

from . import _C  # noqa: F401  registers the mps_ext:: operators

# Python types torch accepts where it wants a dtype.
_PYTHON_DTYPES = {float: torch.float64, int: torch.int64, bool: torch.bool, complex: torch.complex128}


def _check_args(op: str, input, dim, dtype) -> tuple[int, torch.dtype | None]:
    """The argument errors torch's own op gives (TypeError, naming the argument), before the dispatcher's."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{op}(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    if isinstance(dim, bool):
        raise TypeError(f"{op}(): argument 'dim' (position 2) must be int, not bool")
    try:
        dim = operator.index(dim)
    except TypeError:
        raise TypeError(f"{op}(): argument 'dim' (position 2) must be int, not {type(dim).__name__}") from None
    if dtype is not None and not isinstance(dtype, torch.dtype):
        if dtype not in _PYTHON_DTYPES:
            raise TypeError(f"{op}(): argument 'dtype' must be torch.dtype, not {type(dtype).__name__}")
        dtype = _PYTHON_DTYPES[dtype]
    return dim, dtype


def softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Softmax over ``dim``, as ``torch.softmax(input, dim, dtype=dtype)``.

    Runs mps_ext's kernels for float32, float16 and bfloat16 (a float16 or
    bfloat16 input with ``dtype=torch.float32`` is converted inside the
    kernel); on ``mps`` tensors on the GPU, on CPU tensors in the simulator.
    Other cases go to torch. Differentiable.
    """
    dim, dtype = _check_args("softmax", input, dim, dtype)
    return torch.ops.mps_ext.softmax(input, dim, dtype)


def log_softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Log-softmax over ``dim``, as ``torch.log_softmax(input, dim, dtype=dtype)``; see :func:`softmax`."""
    dim, dtype = _check_args("log_softmax", input, dim, dtype)
    return torch.ops.mps_ext.log_softmax(input, dim, dtype)


def _setup(ctx, inputs, output):
    input, dim, _ = inputs
    ctx.dim, ctx.input_dtype = dim, input.dtype
    ctx.save_for_backward(output)


def _softmax_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    return torch._softmax_backward_data(grad, out, ctx.dim, out.dtype).to(ctx.input_dtype), None, None


def _log_softmax_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    return torch._log_softmax_backward_data(grad, out, ctx.dim, out.dtype).to(ctx.input_dtype), None, None


torch.library.register_autograd("mps_ext::softmax", _softmax_backward, setup_context=_setup)
torch.library.register_autograd("mps_ext::log_softmax", _log_softmax_backward, setup_context=_setup)


def _fake(op, input, dim, dtype):
    # torch's meta kernel does not check dim; its CPU kernel raises this.
    ndim = max(input.dim(), 1)
    if not -ndim <= dim < ndim:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], but got {dim})")
    return op(input, dim, dtype=dtype)


# Shapes, dtypes and argument checks without running anything (meta tensors, torch.compile, export):
# torch's own op on the fake input.
@torch.library.register_fake("mps_ext::softmax")
def _softmax_fake(input, dim, dtype=None):
    return _fake(torch.softmax, input, dim, dtype)


@torch.library.register_fake("mps_ext::log_softmax")
def _log_softmax_fake(input, dim, dtype=None):
    return _fake(torch.log_softmax, input, dim, dtype)
