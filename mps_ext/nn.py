"""Modules built on mps_ext's kernels."""

from __future__ import annotations

import torch

from . import fp8

__all__ = ["FP8Experts", "FP8Linear"]


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


class FP8Experts(torch.nn.Module):
    """Mixture-of-Experts experts with FP8 (e4m3fn) weights, in place of transformers 5's stacked experts
    (Qwen3-MoE's ``Qwen3MoeExperts``, Mixtral's ``MixtralExperts``): the same
    ``forward(hidden_states, top_k_index, top_k_weights)``, each token's top-k rows sorted by expert and run
    through :func:`mps_ext.fp8_grouped_mm` for the gate/up and the down projections, as transformers'
    ``grouped_mm`` experts run ``torch._grouped_mm``.

    Buffers: ``gate_up_proj`` (E, 2 * intermediate, hidden) and ``down_proj`` (E, hidden, intermediate)
    holding e4m3fn bits as ``uint8``, with float32 ``gate_up_proj_scale_inv`` and ``down_proj_scale_inv``:
    per output channel (E, N, 1), per expert (E, 1, 1), or (E, ceil(N / bn), ceil(K / bk)) with
    ``block_size=(bn, bk)``.
    Build one with :meth:`from_experts`.
    """

    def __init__(self, gate_up_proj: torch.Tensor, gate_up_proj_scale_inv: torch.Tensor, down_proj: torch.Tensor,
                 down_proj_scale_inv: torch.Tensor, act_fn, block_size: tuple[int, int] | None = None):
        super().__init__()
        self.num_experts, _, self.hidden_dim = gate_up_proj.shape
        self.intermediate_dim = down_proj.shape[2]
        self.block_size = tuple(block_size) if block_size is not None else None
        self.act_fn = act_fn
        self.register_buffer("gate_up_proj", _bits(gate_up_proj.detach()))
        self.register_buffer("gate_up_proj_scale_inv", gate_up_proj_scale_inv.detach().float())
        self.register_buffer("down_proj", _bits(down_proj.detach()))
        self.register_buffer("down_proj_scale_inv", down_proj_scale_inv.detach().float())

    @classmethod
    def from_experts(cls, experts: torch.nn.Module, granularity: str = "channel",
                     block_size: tuple[int, int] = (128, 128)) -> FP8Experts:
        """Quantize ``experts``' ``gate_up_proj`` and ``down_proj`` with amax scaling, one scale per output
        channel of each expert ("channel"), per expert ("tensor") or per ``block_size`` block ("block")."""
        if granularity not in ("channel", "tensor", "block"):
            raise ValueError(f"granularity must be 'channel', 'tensor' or 'block', got {granularity!r}")
        parts = []
        for w in (experts.gate_up_proj.detach(), experts.down_proj.detach()):
            w = w if w.dtype in (torch.float32, torch.float16, torch.bfloat16) else w.float()
            if granularity == "channel":
                parts += fp8.quantize(w, dim=2)
                continue
            block = tuple(w.shape[1:]) if granularity == "tensor" else block_size  # "tensor": (E, 1, 1) scales
            q, s = zip(*(fp8.quantize(m, block=block) for m in w))
            parts += [torch.stack(q), torch.stack(s)]
        return cls(*parts, experts.act_fn, block_size if granularity == "block" else None)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        top_k = top_k_index.shape[-1]
        expert_ids, order = torch.sort(top_k_index.reshape(-1))
        tokens = order // top_k
        offs = torch.cumsum(torch.bincount(expert_ids, minlength=self.num_experts), 0, dtype=torch.int32)
        x = hidden_states[tokens]
        gate, up = fp8.fp8_grouped_mm(x, self.gate_up_proj, self.gate_up_proj_scale_inv, offs,
                                      self.block_size).chunk(2, dim=-1)
        out = fp8.fp8_grouped_mm(self.act_fn(gate) * up, self.down_proj, self.down_proj_scale_inv, offs,
                                 self.block_size)
        out = out * top_k_weights.reshape(-1)[order, None]
        return torch.zeros_like(hidden_states).index_add_(0, tokens, out.to(hidden_states.dtype))

    def extra_repr(self) -> str:
        scales = f"block_size={self.block_size}" if self.block_size else f"scales={tuple(self.down_proj_scale_inv.shape)}"
        return (f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, "
                f"intermediate_dim={self.intermediate_dim}, {scales}")


def _bits(w: torch.Tensor) -> torch.Tensor:
    return w.view(torch.uint8) if w.dtype == torch.float8_e4m3fn else w


def _weight_bits_hook(state_dict, prefix, *args):
    key = prefix + "weight"
    if key in state_dict:
        state_dict[key] = _bits(state_dict[key])
