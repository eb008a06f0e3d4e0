"""FP8 (float8 e4m3fn) on Macs: quantization, scaled matmul and weight-only FP8 linear layers.

e4m3fn tensors are ``torch.float8_e4m3fn`` where the device holds that dtype,
and ``uint8`` tensors holding the same bits elsewhere (``mps`` before torch
2.15, which cannot hold float8 tensors); every function takes either.
Kernels run on ``mps`` tensors on the GPU and on CPU tensors in the
simulator.
"""

from __future__ import annotations

import torch

from . import _C  # noqa: F401  registers the mps_ext:: operators
from . import _autograd

__all__ = ["convert", "dequantize", "fp8_linear", "quantize", "scaled_mm", "storage_dtype"]

E4M3_MAX = 448.0

_TORCH = tuple(int(v) for v in torch.__version__.split(".")[:2])


def storage_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype e4m3fn tensors have on ``device``: ``torch.float8_e4m3fn``, or
    ``torch.uint8`` on ``mps`` before torch 2.15 (the rule of the C++ ops, csrc/ops/fp8.cpp)."""
    return torch.uint8 if torch.device(device).type == "mps" and _TORCH < (2, 15) else torch.float8_e4m3fn


def _as_matrix(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]) if t.dim() >= 2 and t.shape[-1] > 0 else t.reshape(1, -1)


def _moved_last(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t.movedim(dim, -1).reshape(-1, t.shape[dim])


def quantize(x: torch.Tensor, dim: int | None = None, block: tuple[int, int] | None = None):
    """Quantize ``x`` to e4m3fn with amax scaling: returns ``(q, scale)`` with
    ``x ≈ q * scale`` and ``scale = amax / 448`` of each group (1 for an all-zero
    group), ``q = round_to_e4m3fn(x / scale)``.

    - neither ``dim`` nor ``block``: one scale for the tensor (``scale.shape == ()``);
    - ``dim``: one scale per slice along ``dim`` (amax over ``dim``; ``scale`` has
      ``x``'s shape with size 1 at ``dim``, so it broadcasts against ``q``);
    - ``block=(br, bc)`` for a 2-D ``x``: one scale per ``br x bc`` tile, ``scale``
      of shape ``(ceil(rows / br), ceil(cols / bc))`` (FP8 checkpoints use 128 x 128).

    ``x``: float32, float16 or bfloat16. ``q`` has :func:`storage_dtype`.
    """
    if dim is not None and block is not None:
        raise ValueError("quantize: give dim or block, not both")
    if block is not None:
        if x.dim() != 2 or len(block) != 2:
            raise ValueError(f"quantize: block=(rows, cols) needs a 2-D x, got x of shape {tuple(x.shape)}")
        return torch.ops.mps_ext.fp8_quantize(x, int(block[0]), int(block[1]))
    if x.numel() == 0:  # no amax: scale 1
        shape = [] if dim is None else [1 if d == dim % max(x.dim(), 1) else n for d, n in enumerate(x.shape)]
        return torch.empty_like(x, dtype=storage_dtype(x.device)), torch.ones(shape, device=x.device)
    if dim is None:
        flat = _as_matrix(x)
        q, scale = torch.ops.mps_ext.fp8_quantize(flat, max(flat.shape[0], 1), max(flat.shape[1], 1))
        return q.view(x.shape), scale.reshape(())
    dim = dim % max(x.dim(), 1)
    q, scale = torch.ops.mps_ext.fp8_quantize(_moved_last(x, dim), 1, max(x.shape[dim], 1))
    moved = list(x.movedim(dim, -1).shape)
    q = q.view(moved).movedim(-1, dim)
    return q, scale.view(moved[:-1] + [1]).movedim(-1, dim)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32,
               block: tuple[int, int] | None = None) -> torch.Tensor:
    """``q * scale`` in ``dtype`` (float32, float16 or bfloat16): the inverse of :func:`quantize`.

    ``scale`` is one value, one per slice along a dimension (shaped like
    ``q`` with size 1 at that dimension), or, with ``block=(br, bc)`` and a
    2-D ``q``, one per ``br x bc`` tile.
    """
    if block is not None:
        return torch.ops.mps_ext.fp8_dequantize(q, scale, int(block[0]), int(block[1]), dtype)
    if scale.numel() == 1:
        flat = _as_matrix(q)
        out = torch.ops.mps_ext.fp8_dequantize(flat, scale.reshape(1, 1), max(flat.shape[0], 1),
                                               max(flat.shape[1], 1), dtype)
        return out.view(q.shape)
    dims = [d for d in range(q.dim()) if scale.dim() == q.dim() and scale.shape[d] == 1 and q.shape[d] != 1]
    if len(dims) != 1 or any(scale.shape[d] != q.shape[d] for d in range(q.dim()) if d != dims[0]):
        raise ValueError(f"dequantize: scale of shape {tuple(scale.shape)} is neither one value nor one per slice "
                         f"of q of shape {tuple(q.shape)}; pass block=(rows, cols) for block scales")
    dim = dims[0]
    out = torch.ops.mps_ext.fp8_dequantize(_moved_last(q, dim), scale.movedim(dim, -1).reshape(-1, 1), 1,
                                           q.shape[dim], dtype)
    return out.view(list(q.movedim(dim, -1).shape)).movedim(-1, dim)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``(a * scale_a) @ (b * scale_b) + bias`` in ``out_dtype``, as ``torch._scaled_mm``.

    ``a`` (M, K) and ``b`` (K, N) are e4m3fn (``b`` best column-major, i.e. ``w.t()``
    of a row-major ``w``); scales are float32, either both one value
    (tensor-wise) or ``scale_a`` (M, 1) and ``scale_b`` (1, N) (row-wise);
    ``out_dtype`` float32, float16 or bfloat16; ``bias`` (N,). Few rows (M <= 8)
    run a GEMV kernel that reads each byte of ``b`` once, more rows a tiled
    kernel. On CPU tensors, what the kernels do not cover goes to
    ``torch._scaled_mm``; on mps it raises torch's error types.
    """
    return torch.ops.mps_ext.scaled_mm(a, b, scale_a, scale_b, bias, out_dtype)


def fp8_linear(input: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None = None, block_size: tuple[int, int] | None = None) -> torch.Tensor:
    """``F.linear(input, weight * weight_scale, bias)`` for an e4m3fn ``weight``
    (out_features, in_features), computed in float and returned in ``input``'s
    dtype (float32, float16, bfloat16); the weight stays in FP8.

    ``weight_scale`` (float32): shape ``()`` (per tensor), ``(N,)`` or ``(N, 1)``
    (per output channel), or ``(ceil(N / bn), ceil(K / bk))`` with
    ``block_size=(bn, bk)`` (block-wise, as FP8 checkpoints' ``weight_scale_inv``).
    Inputs with at most 8 rows run a GEMV kernel reading each weight byte once.
    Differentiable in ``input`` and ``bias`` (the weight is frozen).
    """
    return torch.ops.mps_ext.fp8_linear(input, weight, weight_scale, bias,
                                        list(block_size) if block_size is not None else None)


def convert(model: torch.nn.Module, granularity: str = "channel",
            block_size: tuple[int, int] = (128, 128)) -> torch.nn.Module:
    """Make ``model`` run its linear layers in FP8, in place, and return it.

    Every ``nn.Linear`` becomes an :class:`mps_ext.nn.FP8Linear` quantized with
    ``granularity`` ("channel", "tensor" or "block" with ``block_size``).
    Modules that already hold FP8 weights — a float8_e4m3fn (or uint8)
    ``weight`` with ``weight_scale_inv`` and ``block_size`` attributes, the form
    Hugging Face transformers' fine-grained FP8 layers load checkpoints into —
    become FP8Linear layers sharing those tensors, without requantizing.
    """
    from .nn import FP8Linear

    for name, child in list(model.named_children()):
        if isinstance(child, FP8Linear):
            continue
        if isinstance(child, torch.nn.Linear):
            setattr(model, name, FP8Linear.from_linear(child, granularity=granularity, block_size=block_size))
        elif _holds_fp8_weights(child):
            setattr(model, name, FP8Linear.from_fp8(child.weight, child.weight_scale_inv,
                                                    getattr(child, "bias", None), child.block_size))
        else:
            convert(child, granularity, block_size)
    return model


def _holds_fp8_weights(module: torch.nn.Module) -> bool:
    w = getattr(module, "weight", None)
    return (isinstance(w, torch.Tensor) and w.dtype in (torch.float8_e4m3fn, torch.uint8) and w.dim() == 2
            and isinstance(getattr(module, "weight_scale_inv", None), torch.Tensor) and hasattr(module, "block_size"))


def _dequantized_weight(weight, weight_scale, block_size, dtype):
    if block_size is not None:
        return dequantize(weight, weight_scale, dtype, block=block_size)
    return dequantize(weight, weight_scale.reshape(()) if weight_scale.numel() == 1 else weight_scale.reshape(-1, 1),
                      dtype)


def _linear_setup(ctx, inputs, kwargs, output):
    input, weight, weight_scale, bias, block_size = inputs
    ctx.save_for_backward(weight, weight_scale)
    ctx.block_size = block_size
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _linear_backward(ctx, grad):
    weight, weight_scale = ctx.saved_tensors
    grad_input = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_input = grad @ _dequantized_weight(weight, weight_scale, ctx.block_size, grad.dtype)
    if ctx.needs_input_grad[3]:
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0).to(ctx.bias_dtype)
    return grad_input, None, None, grad_bias, None


def _linear_jvp(inputs, kwargs, out, tangents):
    # Linear in input, weight_scale and bias (the FP8 weight has no tangent).
    (input, weight, scale, _, block), (t_input, _, t_scale, t_bias, _) = inputs, tangents
    op = torch.ops.mps_ext.fp8_linear
    return _autograd.tangent_sum([None if t_input is None else op(t_input, weight, scale, None, block),
                                  None if t_scale is None else op(input, weight, t_scale, None, block), t_bias], out)


def _scaled_mm_jvp(inputs, kwargs, out, tangents):
    # Linear in each scale and in bias.
    (a, b, scale_a, scale_b, _, out_dtype), (_, _, t_a, t_b, t_bias, _) = inputs, tangents
    op = torch.ops.mps_ext.scaled_mm
    return _autograd.tangent_sum([None if t_a is None else op(a, b, t_a, scale_b, None, out_dtype),
                                  None if t_b is None else op(a, b, scale_a, t_b, None, out_dtype), t_bias], out)


def _dequantize_jvp(inputs, kwargs, out, tangents):
    q, _, block_rows, block_cols, dtype = inputs
    return torch.ops.mps_ext.fp8_dequantize(q, tangents[1], block_rows, block_cols, dtype)


def _no_setup(ctx, inputs, kwargs, output):
    pass


_autograd.register("fp8_linear", _linear_setup, _linear_backward, _linear_jvp)
# Quantizing rounds: no derivative. Scaled products and dequantizing have a
# forward derivative in their scales; reverse mode raises for them.
_autograd.register("fp8_quantize", _no_setup)
_autograd.register("fp8_dequantize", _no_setup, jvp=_dequantize_jvp)
_autograd.register("scaled_mm", _no_setup, jvp=_scaled_mm_jvp)


def _fake_storage(x: torch.Tensor) -> torch.dtype:
    return storage_dtype(x.device)


@torch.library.register_fake("mps_ext::fp8_quantize")
def _(x, block_rows, block_cols):
    rows, cols = x.shape
    scale = x.new_empty(((rows + block_rows - 1) // block_rows, (cols + block_cols - 1) // block_cols),
                        dtype=torch.float32)
    return x.new_empty(x.shape, dtype=_fake_storage(x)), scale


@torch.library.register_fake("mps_ext::fp8_dequantize")
def _(q, scale, block_rows, block_cols, dtype):
    return q.new_empty(q.shape, dtype=dtype)


@torch.library.register_fake("mps_ext::scaled_mm")
def _(a, b, scale_a, scale_b, bias=None, out_dtype=None):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or torch.bfloat16)


@torch.library.register_fake("mps_ext::fp8_linear")
def _(input, weight, weight_scale, bias=None, block_size=None):
    return input.new_empty((*input.shape[:-1], weight.shape[0]))
