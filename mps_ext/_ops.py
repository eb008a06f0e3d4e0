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


def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``input @ weight.T + bias``, as ``torch.nn.functional.linear(input, weight, bias)``.

    Runs mps_ext's GEMV kernels when the leading dimensions of ``input`` hold
    1 to 8 rows (decode), for float32, float16 and bfloat16, with ``weight``
    (out_features, in_features) row-major (any row stride) and ``bias`` None or
    1-D: one pass over the weights for all rows, float accumulation, the bias
    added before the one rounding. On ``mps`` tensors on the GPU, on CPU
    tensors in the simulator; everything else goes to torch. Mismatched
    dtypes, devices or sizes raise ``RuntimeError`` naming the argument.
    Differentiable.
    """
    return torch.ops.mps_ext.linear(input, weight, bias)


@torch.library.register_fake("mps_ext::linear")
def _linear_fake(input, weight, bias=None):
    return torch.nn.functional.linear(input, weight, bias)


def _linear_setup(ctx, inputs, output):
    input, weight, bias = inputs
    ctx.bias_shape = None if bias is None else bias.shape
    ctx.save_for_backward(input, weight)


def _linear_backward(ctx, grad):
    input, weight = ctx.saved_tensors
    grad_input = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_input = grad.unsqueeze(-1) * weight if weight.dim() == 1 else grad @ weight
    if ctx.needs_input_grad[1]:
        if weight.dim() == 1:
            grad_weight = (grad.unsqueeze(-1) * input).reshape(-1, weight.shape[0]).sum(0)
        else:
            grad_weight = grad.reshape(-1, weight.shape[0]).t() @ input.reshape(-1, weight.shape[1])
    if ctx.needs_input_grad[2]:
        grad_bias = grad.sum_to_size(ctx.bias_shape)
    return grad_input, grad_weight, grad_bias


torch.library.register_autograd("mps_ext::linear", _linear_backward, setup_context=_linear_setup)
