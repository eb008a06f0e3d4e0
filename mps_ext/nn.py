"""Modules built on mps_ext's kernels."""

from __future__ import annotations

import math
import types

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
        self._register_load_state_dict_pre_hook(_fp8_bits_hook, with_module=True)

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
        bits) and its scales, as stored in FP8 checkpoints; nothing is requantized.
        Raises ``ValueError`` naming the argument whose shape or dtype does not fit:
        ``weight_scale_inv`` must be the block grid of ``block_size`` (a transposed
        grid would scale the wrong blocks), or one value or one per output channel."""
        if weight.dim() != 2 or weight.dtype not in (torch.float8_e4m3fn, torch.uint8):
            raise ValueError(f"FP8Linear.from_fp8: weight must be 2-D float8_e4m3fn (or uint8 bits), got "
                             f"{weight.dtype} of shape {tuple(weight.shape)}")
        n, k = weight.shape
        why = fp8._scale_mismatch(weight_scale_inv, n, k, block_size)
        if why:
            raise ValueError(f"FP8Linear.from_fp8: weight_scale_inv {why}")
        if bias is not None and tuple(bias.shape) != (n,):
            raise ValueError(f"FP8Linear.from_fp8: bias has shape {tuple(bias.shape)}, expected {(n,)}")
        layer = cls(k, n, bias=bias is not None, block_size=block_size, device=weight.device)
        layer.weight = _bits(weight.detach())
        per_tensor = block_size is None and weight_scale_inv.numel() == 1
        layer.weight_scale_inv = weight_scale_inv.detach().float().reshape(() if per_tensor else
                                                                           layer.weight_scale_inv.shape)
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
    (Qwen3-MoE's ``Qwen3MoeExperts``, Mixtral's, DeepSeek-V3's, gpt-oss's ``GptOssExperts``): the same
    ``forward(hidden_states, top_k_index, top_k_weights)``, each token's top-k rows sorted by expert and run
    through :func:`mps_ext.fp8_grouped_mm` for the gate/up and the down projections, as transformers'
    ``grouped_mm`` experts run ``torch._grouped_mm``, biases added per row and the gate applied between.

    Buffers: ``gate_up_proj`` (E, 2 * intermediate, hidden) and ``down_proj`` (E, hidden, intermediate)
    holding e4m3fn bits as ``uint8`` (a state dict's float8_e4m3fn tensors load into them bit for bit), always
    (E, out, in), whatever layout the model stored; float32
    ``gate_up_proj_scale_inv`` and ``down_proj_scale_inv``: per output channel (E, N, 1), per expert
    (E, 1, 1), or (E, ceil(N / bn), ceil(K / bk)) with ``block_size=(bn, bk)``; ``gate_up_proj_bias``
    (E, 2 * intermediate) and ``down_proj_bias`` (E, hidden) in the model's dtype, or None.
    ``apply_gate`` maps the gate/up product (rows, 2 * intermediate) to (rows, intermediate).
    Build one with :meth:`from_experts` (float experts) or :meth:`from_fp8` (FP8 experts).
    """

    def __init__(self, gate_up_proj: torch.Tensor, gate_up_proj_scale_inv: torch.Tensor, down_proj: torch.Tensor,
                 down_proj_scale_inv: torch.Tensor, apply_gate, block_size: tuple[int, int] | None = None,
                 gate_up_proj_bias: torch.Tensor | None = None, down_proj_bias: torch.Tensor | None = None):
        super().__init__()
        self.num_experts, _, self.hidden_dim = gate_up_proj.shape
        self.intermediate_dim = down_proj.shape[2]
        self.block_size = tuple(block_size) if block_size is not None else None
        self.apply_gate = apply_gate
        self.register_buffer("gate_up_proj", _bits(gate_up_proj.detach()))
        self.register_buffer("gate_up_proj_scale_inv", gate_up_proj_scale_inv.detach().float())
        self.register_buffer("down_proj", _bits(down_proj.detach()))
        self.register_buffer("down_proj_scale_inv", down_proj_scale_inv.detach().float())
        self.register_buffer("gate_up_proj_bias", _detached(gate_up_proj_bias))
        self.register_buffer("down_proj_bias", _detached(down_proj_bias))
        self._register_load_state_dict_pre_hook(_fp8_bits_hook, with_module=True)

    @classmethod
    def from_experts(cls, experts: torch.nn.Module, granularity: str = "channel",
                     block_size: tuple[int, int] = (128, 128)) -> FP8Experts:
        """Quantize ``experts``' ``gate_up_proj`` and ``down_proj`` with amax scaling, one scale per output
        channel of each expert ("channel"), per expert ("tensor") or per ``block_size`` block ("block").

        Experts stored (E, in, out) (transformers' ``is_transposed``: gpt-oss) are transposed first: every
        FP8 expert is (E, out, in), so one decode kernel, streaming each output channel's row, serves all
        models, and per-channel scales are per output channel in both layouts."""
        if granularity not in ("channel", "tensor", "block"):
            raise ValueError(f"granularity must be 'channel', 'tensor' or 'block', got {granularity!r}")
        parts = []
        for w in (experts.gate_up_proj.detach(), experts.down_proj.detach()):
            w = w.transpose(1, 2).contiguous() if getattr(experts, "is_transposed", False) else w
            w = w if w.dtype in (torch.float32, torch.float16, torch.bfloat16) else w.float()
            if granularity == "channel":
                parts += fp8.quantize(w, dim=2)
                continue
            block = tuple(w.shape[1:]) if granularity == "tensor" else block_size  # "tensor": (E, 1, 1) scales
            q, s = zip(*(fp8.quantize(m, block=block) for m in w))
            parts += [torch.stack(q), torch.stack(s)]
        return cls(*parts, _ExpertsGate(experts), block_size if granularity == "block" else None,
                   *_biases_of(experts))

    @classmethod
    def from_fp8(cls, gate_up_proj: torch.Tensor, gate_up_proj_scale_inv: torch.Tensor, down_proj: torch.Tensor,
                 down_proj_scale_inv: torch.Tensor, block_size: tuple[int, int] | None,
                 experts: torch.nn.Module) -> FP8Experts:
        """Experts around existing e4m3fn weights (E, out, in) and their scales, as transformers' FP8
        ``FP8Experts`` holds them and FP8 checkpoints store them; nothing is requantized. ``experts`` gives
        the gate and the biases (transformers' FP8 experts, or the float experts the weights stand for).

        ``gate_up_proj_scale_inv`` follows transformers' loader, which concatenates the gate's and the up
        projection's scales: with ``block_size=(bn, bk)``, (E, 2 * ceil(I / bn), ceil(H / bk)), each half
        its own block grid; without, (E, 2, 1), one scale per half (or per expert, or per channel). Halves
        whose size I is not a multiple of bn get blocks of gcd(I, bn) rows (the scales repeated, the bytes
        shared as they are); ``down_proj_scale_inv`` is a regular grid, (E, ceil(H / bn), ceil(I / bk)).
        Raises ``ValueError`` naming the argument whose shape or dtype does not fit.
        """
        for arg, w in (("gate_up_proj", gate_up_proj), ("down_proj", down_proj)):
            if w.dim() != 3 or w.dtype not in (torch.float8_e4m3fn, torch.uint8):
                raise ValueError(f"FP8Experts.from_fp8: {arg} must be 3-D float8_e4m3fn (or uint8 bits), got "
                                 f"{w.dtype} of shape {tuple(w.shape)}")
        for arg, s in (("gate_up_proj_scale_inv", gate_up_proj_scale_inv),
                       ("down_proj_scale_inv", down_proj_scale_inv)):
            if not s.is_floating_point() or s.dtype.itemsize == 1:
                raise ValueError(f"FP8Experts.from_fp8: {arg} is {s.dtype}, expected float32")
        e, n2, k = gate_up_proj.shape
        half = n2 // 2
        if n2 % 2 or down_proj.shape != (e, k, half):
            raise ValueError(f"FP8Experts.from_fp8: down_proj has shape {tuple(down_proj.shape)}, expected "
                             f"{(e, k, half)} for a gate_up_proj of shape {(e, n2, k)}")
        if block_size is None:
            per_half = gate_up_proj_scale_inv.reshape(e, -1, 1)
            if per_half.shape[1] not in (1, 2, n2):
                raise ValueError(f"FP8Experts.from_fp8: gate_up_proj_scale_inv of shape "
                                 f"{tuple(gate_up_proj_scale_inv.shape)} has neither one scale per expert, per half "
                                 f"nor per channel of a gate_up_proj of shape {(e, n2, k)}")
            if down_proj_scale_inv.numel() not in (e, e * k):
                raise ValueError(f"FP8Experts.from_fp8: down_proj_scale_inv of shape "
                                 f"{tuple(down_proj_scale_inv.shape)} has neither one scale per expert nor per "
                                 f"channel of a down_proj of shape {(e, k, half)}")
            return cls(gate_up_proj, per_half.repeat_interleave(n2 // per_half.shape[1], 1), down_proj,
                       down_proj_scale_inv.reshape(e, -1, 1), _ExpertsGate(experts), None, *_biases_of(experts))
        bn, bk = block_size
        rows = -(-half // bn)
        if gate_up_proj_scale_inv.shape != (e, 2 * rows, -(-k // bk)):
            raise ValueError(f"FP8Experts.from_fp8: gate_up_proj_scale_inv has shape "
                             f"{tuple(gate_up_proj_scale_inv.shape)}, expected {(e, 2 * rows, -(-k // bk))}: two "
                             f"grids of {bn} x {bk} blocks over halves of {half} rows")
        if down_proj_scale_inv.shape != (e, -(-k // bn), -(-half // bk)):
            raise ValueError(f"FP8Experts.from_fp8: down_proj_scale_inv has shape {tuple(down_proj_scale_inv.shape)}, "
                             f"expected {(e, -(-k // bn), -(-half // bk))}: a grid of {bn} x {bk} blocks over a "
                             f"down_proj of shape {(e, k, half)}")
        fine = math.gcd(half, bn)
        halves = gate_up_proj_scale_inv.unflatten(1, (2, rows)).repeat_interleave(bn // fine, 2)[:, :, :half // fine]
        down = down_proj_scale_inv.repeat_interleave(bn // fine, 1)[:, :-(-down_proj.shape[1] // fine)]
        return cls(gate_up_proj, halves.flatten(1, 2), down_proj, down, _ExpertsGate(experts), (fine, bk),
                   *_biases_of(experts))

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        top_k = top_k_index.shape[-1]
        expert_ids, order = torch.sort(top_k_index.reshape(-1))
        tokens = order // top_k
        offs = torch.cumsum(torch.bincount(expert_ids, minlength=self.num_experts), 0, dtype=torch.int32)
        x = self._project(hidden_states[tokens], self.gate_up_proj, self.gate_up_proj_scale_inv,
                          self.gate_up_proj_bias, expert_ids, offs)
        out = self._project(self.apply_gate(x), self.down_proj, self.down_proj_scale_inv, self.down_proj_bias,
                            expert_ids, offs)
        out = out * top_k_weights.reshape(-1)[order, None]
        return torch.zeros_like(hidden_states).index_add_(0, tokens, out.to(hidden_states.dtype))

    def _project(self, x, weight, scale, bias, expert_ids, offs):
        out = fp8.fp8_grouped_mm(x, weight, scale, offs, self.block_size)
        return out if bias is None else out + bias[expert_ids]

    def extra_repr(self) -> str:
        scales = f"block_size={self.block_size}" if self.block_size else f"scales={tuple(self.down_proj_scale_inv.shape)}"
        return (f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, "
                f"intermediate_dim={self.intermediate_dim}, bias={self.down_proj_bias is not None}, {scales}")


class _ExpertsGate:
    """``experts``' own ``_apply_gate`` (transformers' gated experts define it: ``act_fn(gate) * up``, gpt-oss's
    clamped interleaved SwiGLU, ...) run on a copy of the plain attributes and submodules it reads, so that the
    gate is the model's and the float expert weights are not kept alive by it. It keeps the experts' class, not
    a method bound to the copy: pickle stores a class by name, while a bound method is looked up again on its
    object when loaded, and the copy has no such method."""

    def __init__(self, experts: torch.nn.Module):
        self.experts_class = type(experts)
        state = {k: v for k, v in vars(experts).items() if not k.startswith("_")} | dict(experts.named_children())
        self.state = types.SimpleNamespace(**state)

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.experts_class._apply_gate(self.state, gate_up)


def _biases_of(experts: torch.nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    return getattr(experts, "gate_up_proj_bias", None), getattr(experts, "down_proj_bias", None)


def _detached(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def _bits(w: torch.Tensor) -> torch.Tensor:
    return w.view(torch.uint8) if w.dtype == torch.float8_e4m3fn else w


def _fp8_bits_hook(module, state_dict, prefix, *args):
    """Float8 tensors of a state dict load into the uint8 buffers holding e4m3fn bits bit for bit: a copy into
    them would convert each value to an integer."""
    for name, buffer in module.named_buffers(recurse=False):
        if buffer.dtype == torch.uint8 and prefix + name in state_dict:
            state_dict[prefix + name] = _bits(state_dict[prefix + name])
