"""The Python API of mps_ext's ops, with torch's semantics and autograd."""

from __future__ import annotations

import torch

from . import _C  # noqa: F401  registers the mps_ext:: operators


def softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Softmax over ``dim``, as ``torch.softmax(input, dim, dtype=dtype)``.

    Runs mps_ext's kernels for float32, float16 and bfloat16 (a float16 or
    bfloat16 input with ``dtype=torch.float32`` is converted inside the
    kernel); on ``mps`` tensors on the GPU, on CPU tensors in the simulator.
    Other cases go to torch. Differentiable.
    """
    return torch.ops.mps_ext.softmax(input, dim, dtype)


def log_softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Log-softmax over ``dim``, as ``torch.log_softmax(input, dim, dtype=dtype)``; see :func:`softmax`."""
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
