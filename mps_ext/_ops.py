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


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Grouped matrix product, as ``torch._grouped_mm(a, b, offs=offs, out_dtype=out_dtype)``.

    ``offs`` (int32, cumulative ends) splits the rows of ``a`` for 2-D ``a`` and
    3-D ``b`` (one matrix of ``b`` per group: Mixture-of-Experts), the columns
    of ``b`` for 3-D ``a`` and 2-D ``b``, K for two 2-D operands (output
    ``(G, M, N)``); two 3-D operands are a batched product without ``offs``.
    Positions past ``offs[-1]`` are left unwritten, as torch leaves them.
    Runs mps_ext's kernels for float32, float16 and bfloat16 with ``offs``
    read on the device (one dispatch, no synchronisation); ``b`` as the
    transposed expert weights (``experts.transpose(-2, -1)``) takes the
    decode kernel when groups are small. Unlike torch, any strides and
    alignments are accepted. Invalid arguments raise torch's
    ``RuntimeError`` naming the argument. Differentiable.
    """
    return torch.ops.mps_ext.grouped_mm(a, b, offs, out_dtype)


def _grouped_mm_layout(a, b, offs):
    """torch's output sizes and strides: the last dimension padded to 16 bytes."""
    if a.dim() == 2 and b.dim() == 2:
        size = [offs.shape[0], a.shape[0], b.shape[1]]
    elif a.dim() == 2:
        size = [a.shape[0], b.shape[-1]]
    elif b.dim() == 2:
        size = [a.shape[1], b.shape[1]]
    else:
        size = [a.shape[0], a.shape[1], b.shape[-1]]
    align = 16 // a.element_size()
    padded = (size[-1] + align - 1) // align * align
    stride = [padded, 1] if len(size) == 2 else [size[1] * padded, padded, 1]
    return size, stride


@torch.library.register_fake("mps_ext::grouped_mm")
def _grouped_mm_fake(a, b, offs=None, out_dtype=None):
    torch._check(a.dim() in (2, 3) and b.dim() in (2, 3), lambda: "a and b have to be 2 or 3d")
    torch._check((offs is not None) == (a.dim() == 2 or b.dim() == 2),
                 lambda: "Have to provide offsets (offs) if there is a 2d matrix, or no offset if both are 3d")
    torch._check(out_dtype is None or out_dtype == a.dtype, lambda: "out_dtype must match a's dtype")
    size, stride = _grouped_mm_layout(a, b, offs)
    return torch.empty_strided(size, stride, dtype=a.dtype, device=a.device)


def _grouped_mm_setup(ctx, inputs, output):
    a, b, offs, _ = inputs
    ctx.save_for_backward(a, b, offs)


def _zero_past(t, offs, dim):
    """``t`` with the positions at or past ``offs[-1]`` along ``dim`` set to 0 (on the device)."""
    if offs.numel() == 0:
        return torch.zeros_like(t)
    shape = [1] * t.dim()
    shape[dim] = t.shape[dim]
    keep = torch.arange(t.shape[dim], device=t.device).view(shape) < offs[-1:].view([1] * t.dim())
    return torch.where(keep, t, torch.zeros((), dtype=t.dtype, device=t.device))


def _grouped_mm_backward(ctx, grad):
    a, b, offs = ctx.saved_tensors
    grad_a = grad_b = None
    gm = torch.ops.mps_ext.grouped_mm
    if a.dim() == 2 and b.dim() == 3:  # rows of a split
        grad = _zero_past(grad, offs, 0)
        if ctx.needs_input_grad[0]:
            grad_a = _zero_past(gm(grad, b.transpose(-2, -1), offs, None), offs, 0)
        if ctx.needs_input_grad[1]:
            grad_b = gm(a.t(), grad, offs, None)
    elif a.dim() == 3 and b.dim() == 2:  # columns of b split
        grad = _zero_past(grad, offs, 1)
        if ctx.needs_input_grad[0]:
            grad_a = gm(grad, b.t(), offs, None)
        if ctx.needs_input_grad[1]:
            grad_b = _zero_past(gm(a.transpose(-2, -1), grad, offs, None), offs, 1)
    elif a.dim() == 2:  # K split
        if ctx.needs_input_grad[0]:
            grad_a = _zero_past(gm(grad, b.t(), offs, None), offs, 1)
        if ctx.needs_input_grad[1]:
            grad_b = _zero_past(gm(a.t(), grad, offs, None), offs, 0)
    else:
        if ctx.needs_input_grad[0]:
            grad_a = gm(grad, b.transpose(-2, -1), None, None)
        if ctx.needs_input_grad[1]:
            grad_b = gm(a.transpose(-2, -1), grad, None, None)
    return grad_a, grad_b, None, None


torch.library.register_autograd("mps_ext::grouped_mm", _grouped_mm_backward, setup_context=_grouped_mm_setup)
