"""Modules built on mps_ext's kernels."""

from __future__ import annotations

import torch

from . import fp8

__all__ = ["FP8Linear"]


class FP8Linear(torch.nn.Module):
    """A linear layer with an FP8 (e4m3fn) weight: ``F.linear(x, weight * scale, bias)``
    computed by :func:`mps_ext.fp8_linear`, in the input's dtype.

    Buffers: ``weight`` (out_features, in_features) holding e4m3fn bits as
    ``uint8`` (so ``.to("mps")`` works on every torch version; checkpoints with
    float8_e4m3fn weights load into it bit for bit), ``weight_scale_inv``
    (float32: shape ``()``, ``(out_features, 1)`` or block-wise
    ``(ceil(N / bn), ceil(K / bk))`` with ``block_size=(bn, bk)``), and ``bias``
    (float32) or None. Build one with :meth:`from_linear` or :meth:`from_fp8`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 block_size: tuple[int, int] | None = None, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.block_size = tuple(block_size) if block_size is not None else None
        if self.block_size is None:
            scale_shape = (out_features, 1)
        else:
            bn, bk = self.block_size
            scale_shape = (-(-out_features // bn), -(-in_features // bk))
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.uint8, device=device))
        self.register_buffer("weight_scale_inv", torch.ones(scale_shape, dtype=torch.float32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)
        self._register_load_state_dict_pre_hook(_weight_bits_hook)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, granularity: str = "channel",
                    block_size: tuple[int, int] = (128, 128)) -> FP8Linear:
        """Quantize ``linear``'s weight with amax scaling, one scale per output
        channel ("channel"), for the whole weight ("tensor") or per ``block_size``
        block ("block")."""
        w = linear.weight.detach()
        if w.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            w = w.float()
        if granularity == "channel":
            q, scale, block = *fp8.quantize(w, dim=1), None
        elif granularity == "tensor":
            q, scale, block = *fp8.quantize(w), None
        elif granularity == "block":
            q, scale, block = *fp8.quantize(w, block=block_size), block_size
        else:
            raise ValueError(f"granularity must be 'channel', 'tensor' or 'block', got {granularity!r}")
        return cls.from_fp8(q, scale, linear.bias, block)

    @classmethod
    def from_fp8(cls, weight: torch.Tensor, weight_scale_inv: torch.Tensor, bias: torch.Tensor | None = None,
                 block_size: tuple[int, int] | None = None) -> FP8Linear:
        """A layer around an existing e4m3fn ``weight`` (float8_e4m3fn or uint8
        bits) and its scales, as stored in FP8 checkpoints; nothing is requantized."""
        n, k = weight.shape
        layer = cls(k, n, bias=bias is not None, block_size=block_size, device=weight.device)
        layer.weight = _bits(weight.detach())
        layer.weight_scale_inv = weight_scale_inv.detach().float().reshape(
            layer.weight_scale_inv.shape if weight_scale_inv.numel() != 1 else ())
        if bias is not None:
            layer.bias = bias.detach().float()
        return layer

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return fp8.fp8_linear(input, self.weight, self.weight_scale_inv, self.bias, self.block_size)

    def extra_repr(self) -> str:
        scales = f"block_size={self.block_size}" if self.block_size else f"scales={tuple(self.weight_scale_inv.shape)}"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, {scales}"


def _bits(w: torch.Tensor) -> torch.Tensor:
    return w.view(torch.uint8) if w.dtype == torch.float8_e4m3fn else w


def _weight_bits_hook(state_dict, prefix, *args):
    key = prefix + "weight"
    if key in state_dict:
        state_dict[key] = _bits(state_dict[key])
