"""FP8 (float8 e4m3fn) on Macs: quantization, scaled matmul (e5m2 too), weight-only FP8 linear layers,
models converted to them and Hugging Face FP8 checkpoints loaded into them.

e4m3fn tensors are ``torch.float8_e4m3fn`` where the device holds that dtype,
and ``uint8`` tensors holding the same bits elsewhere (``mps`` before torch
2.15, where no torch kernel takes a float8 tensor, while uint8 ones are
copied, sliced and stacked like any other); every function takes either.
Kernels run on ``mps`` tensors on the GPU and on CPU tensors in the
simulator.
"""

from __future__ import annotations

import fnmatch
import json
import os
import warnings
from collections.abc import Iterable

import torch

from . import _C  # noqa: F401  registers the mps_ext:: operators
from . import _autograd

__all__ = ["convert", "dequantize", "fp8_grouped_mm", "fp8_linear", "from_pretrained", "quantize", "scaled_mm",
           "storage_dtype"]

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
    if dim is not None:
        ndim = max(x.dim(), 1)
        if not -ndim <= dim < ndim:
            raise IndexError(f"fp8.quantize: dim out of range (expected to be in range of [{-ndim}, {ndim - 1}], "
                             f"but got {dim})")
        dim %= ndim
    if x.numel() == 0:  # no amax: scale 1
        shape = [] if dim is None else [1 if d == dim else n for d, n in enumerate(x.shape)]
        return torch.empty_like(x, dtype=storage_dtype(x.device)), torch.ones(shape, device=x.device)
    if dim is None:
        flat = _as_matrix(x)
        q, scale = torch.ops.mps_ext.fp8_quantize(flat, max(flat.shape[0], 1), max(flat.shape[1], 1))
        return q.view(x.shape), scale.reshape(())
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
    if not dims and scale.shape == q.shape:  # quantize(x, dim=d) of an x with x.shape[d] == 1
        dims = [d for d in range(q.dim()) if q.shape[d] == 1][:1]
    if len(dims) != 1 or any(scale.shape[d] != q.shape[d] for d in range(q.dim()) if d != dims[0]):
        raise ValueError(f"dequantize: scale of shape {tuple(scale.shape)} is neither one value nor one per slice "
                         f"of q of shape {tuple(q.shape)}; pass block=(rows, cols) for block scales")
    dim = dims[0]
    out = torch.ops.mps_ext.fp8_dequantize(_moved_last(q, dim), scale.movedim(dim, -1).reshape(-1, 1), 1,
                                           q.shape[dim], dtype)
    return out.view(list(q.movedim(dim, -1).shape)).movedim(-1, dim)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
              scale_result: torch.Tensor | None = None) -> torch.Tensor:
    """``(a * scale_a) @ (b * scale_b) + bias`` in ``out_dtype``, as ``torch._scaled_mm``.

    ``a`` (M, K) and ``b`` (K, N) are e4m3fn or e5m2, in any mix (``b`` best
    column-major, i.e. ``w.t()`` of a row-major ``w``); scales are float32,
    either both one value (tensor-wise) or ``scale_a`` (M, 1) and ``scale_b``
    (1, N) (row-wise); ``bias`` (N,); ``out_dtype`` float32, float16, bfloat16,
    float8_e4m3fn or float8_e5m2. A float8 output is the float result times
    ``1 / scale_result`` (one value; 1 if None) converted as torch converts it:
    past the format's range e4m3fn gives NaN and e5m2 infinity. Few rows
    (M <= 8) run a GEMV kernel that reads each byte of ``b`` once, more rows a
    tiled kernel. On CPU tensors, what the kernels do not cover (the fnuz
    formats) goes to ``torch._scaled_mm``; on mps it raises torch's error types.
    """
    return torch.ops.mps_ext.scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, scale_result)


def fp8_linear(input: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None = None, block_size: tuple[int, int] | None = None) -> torch.Tensor:
    """``F.linear(input, weight * weight_scale, bias)`` for an e4m3fn ``weight``
    (out_features, in_features), computed in float and returned in ``input``'s
    dtype (float32, float16, bfloat16); the weight stays in FP8.

    ``weight_scale`` (float32): shape ``()`` (per tensor), ``(N,)`` or ``(N, 1)``
    (per output channel), or ``(ceil(N / bn), ceil(K / bk))`` with
    ``block_size=(bn, bk)`` (block-wise, as FP8 checkpoints' ``weight_scale_inv``).
    Inputs with at most 8 rows run a GEMV kernel reading each weight byte once (one row
    with ``in_features`` up to 16384: the row held in registers, the weight streamed past it).
    Differentiable in ``input`` and ``bias`` (the weight is frozen).
    """
    return torch.ops.mps_ext.fp8_linear(input, weight, weight_scale, bias,
                                        list(block_size) if block_size is not None else None)


def fp8_grouped_mm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, offs: torch.Tensor,
                   block_size: tuple[int, int] | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Mixture-of-Experts products with e4m3fn expert weights:
    ``torch._grouped_mm(x, (weight * weight_scale).transpose(-2, -1), offs=offs)``, the weights kept in FP8.

    ``x`` (rows, K): float32, float16 or bfloat16, its rows sorted by expert; ``weight`` (E, N, K) e4m3fn
    (uint8 bits where the device holds no float8), the layout of transformers' stacked experts;
    ``offs`` (E,) int32, each expert's cumulative row end. ``weight_scale`` (float): per expert ``(E,)`` or
    ``(E, 1, 1)``, per output channel ``(E, N)`` or ``(E, N, 1)``, or with ``block_size=(bn, bk)`` one per
    block of each expert, ``(E, ceil(N / bn), ceil(K / bk))``. Returns (rows, N) in ``x``'s dtype (``out_dtype``, if given, must be
    that dtype); rows past ``offs[-1]`` are left unwritten, as torch leaves them. Up to two rows per expert on
    average (decode) run a kernel that holds each routed row in registers and streams its expert's FP8 bytes
    past it; up to eight a kernel that reads each routed expert's bytes once for its rows; more rows (prefill)
    a tiled kernel that decodes them into its tiles. Differentiable in ``x`` (the weights are frozen).
    """
    return torch.ops.mps_ext.fp8_grouped_mm(x, weight, weight_scale, offs,
                                            list(block_size) if block_size is not None else None, out_dtype)


# Hugging Face's FP8 recipes keep these in the model's dtype: the output projection (often tied to the
# embeddings) is where FP8 rounding shows most in the tokens.
DEFAULT_EXCLUDE = ("lm_head", "*embed*")


def convert(model: torch.nn.Module, granularity: str = "channel", block_size: tuple[int, int] = (128, 128),
            exclude: Iterable[str] = DEFAULT_EXCLUDE) -> torch.nn.Module:
    """Make ``model`` run its linear layers in FP8, in place, and return it.

    - Modules that already hold FP8 weights are adopted as they are, bytes and
      scales shared, never requantized: Hugging Face transformers' ``FP8Linear``
      and any module whose ``weight`` is float8_e4m3fn (or uint8) with a
      ``weight_scale_inv`` and a ``block_size`` (None: one scale for the tensor);
      transformers' FP8 ``FP8Experts`` become an :class:`mps_ext.nn.FP8Experts`.
    - Every other ``nn.Linear`` becomes an :class:`mps_ext.nn.FP8Linear` quantized
      with ``granularity`` ("channel", "tensor" or "block" with ``block_size``).
    - Mixture-of-Experts experts stored stacked as transformers 5 stores them
      (gated ``gate_up_proj`` and ``down_proj`` parameters, (E, out, in) or
      transposed (E, in, out), with or without biases: Qwen3-MoE, Mixtral,
      DeepSeek-V3, gpt-oss) become an :class:`mps_ext.nn.FP8Experts` quantized the
      same way per expert ("tensor": one scale per expert), whose products run
      :func:`fp8_grouped_mm`. Experts without a gate or with a post-expert norm
      stay as they are, with a warning.
    - ``exclude``: module names or ``fnmatch`` patterns, matched against the
      full name (``model.layers.0.mlp``) and the last part (``lm_head``); an
      excluded module and everything inside it stay as they are. By default
      ``lm_head`` and the embeddings, as Hugging Face's FP8 recipes do.
    - Linear layers whose weight another module shares (tied embeddings) and
      the ones torch marks as read directly by their parent
      (``nn.MultiheadAttention``'s ``out_proj``) stay as they are, with a warning.

    Raises ``NotImplementedError`` naming any other module that holds float8
    tensors (e5m2 weights, FP8 embeddings, FP8 experts without a gate): they
    would be read as floats. Exclude them to keep them as they are.
    """
    from .nn import FP8Experts, FP8Linear

    patterns = [exclude] if isinstance(exclude, str) else list(exclude)
    owners: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for t in module.parameters(recurse=False):
            owners.setdefault(id(t), []).append(name)

    # Every layer is checked and built before any is replaced: an error leaves the model as it was.
    plan = []

    def visit(module: torch.nn.Module, prefix: str) -> None:
        for child_name, child in module.named_children():
            name = f"{prefix}{child_name}"
            if isinstance(child, (FP8Experts, FP8Linear)) or _excluded(name, patterns):
                continue
            if _holds_fp8_weights(child):
                scale = _scale_of(name, child)
                plan.append((module, child_name, lambda c=child, s=scale: FP8Linear.from_fp8(
                    c.weight, s, getattr(c, "bias", None), c.block_size)))
            elif _fp8_experts(child):
                _check_experts(name, child)
                plan.append((module, child_name, lambda c=child: FP8Experts.from_fp8(
                    c.gate_up_proj, c.gate_up_proj_scale_inv, c.down_proj, c.down_proj_scale_inv, c.block_size, c)))
            elif _holds_fp8(child):
                raise NotImplementedError(f"convert: {name} ({type(child).__name__}) holds float8 tensors that "
                                          "mps_ext cannot adopt; pass exclude=[...] with its name to keep it as it is")
            elif _stacked_experts(child):
                why = _kept_experts(child)
                if why:
                    warnings.warn(f"convert: {name} ({type(child).__name__}) stays {child.down_proj.dtype}: {why}",
                                  stacklevel=2)
                else:
                    plan.append((module, child_name,
                                 lambda c=child: FP8Experts.from_experts(c, granularity, block_size)))
            elif isinstance(child, torch.nn.Linear):
                why = _kept_linear(child, [o for o in owners.get(id(child.weight), []) if o != name])
                if why:
                    warnings.warn(f"convert: {name} stays {child.weight.dtype}: {why}", stacklevel=2)
                else:
                    plan.append((module, child_name, lambda c=child: FP8Linear.from_linear(c, granularity, block_size)))
            else:
                visit(child, f"{name}.")

    visit(model, "")
    for parent, child_name, layer in [(parent, child_name, build()) for parent, child_name, build in plan]:
        setattr(parent, child_name, layer)
    return model


def from_pretrained(path: str | os.PathLike, dtype: torch.dtype = torch.bfloat16, model_class=None) -> torch.nn.Module:
    """Load a Hugging Face FP8 checkpoint with its FP8 layers kept in FP8, on the CPU, and return the model
    (in eval mode; move it with ``.to("mps")``).

    ``path``: a local directory in Hugging Face's fine-grained FP8 format (DeepSeek-V3, Qwen3-*-FP8):
    ``config.json`` whose ``quantization_config`` has ``quant_method`` "fp8" and ``weight_block_size``
    (``[128, 128]``, or null for one scale per tensor), and ``model.safetensors`` (or shards with their
    ``model.safetensors.index.json``) holding float8_e4m3fn ``<layer>.weight`` tensors with float32
    ``<layer>.weight_scale_inv`` scales. The model is built with transformers (``model_class``, default
    ``AutoModelForCausalLM``) in ``dtype``; each linear layer with a ``weight_scale_inv`` becomes an
    :class:`mps_ext.nn.FP8Linear` holding the checkpoint's bytes and scales unchanged (partial blocks
    included); so do stacked MoE experts whose experts the checkpoint stores one by one
    (``<experts>.<e>.{gate,up,down}_proj.weight`` with their ``weight_scale_inv``, as Qwen3-MoE's
    FP8 checkpoints do), as an :class:`mps_ext.nn.FP8Experts`; the rest (``modules_to_not_convert``,
    norms, embeddings) loads in ``dtype``. Static activation scales are not used: activations stay in
    ``dtype``. A float8 tensor that is neither such a linear layer's weight nor such experts' raises
    ``NotImplementedError`` naming it. Nothing is downloaded: fetch a hub checkpoint first
    (``huggingface-cli download <id> --local-dir <path>``).
    """
    import transformers
    from .nn import FP8Linear

    config = transformers.AutoConfig.from_pretrained(path)
    quant = getattr(config, "quantization_config", None) or {}
    quant = quant if isinstance(quant, dict) else quant.to_dict()
    if quant.get("quant_method") != "fp8":
        raise ValueError(f"from_pretrained: {path} is not a fine-grained FP8 checkpoint: its config.json has "
                         f"quantization_config {quant or None}, expected quant_method 'fp8'")
    config.quantization_config = None
    block = quant.get("weight_block_size")
    model = (model_class or transformers.AutoModelForCausalLM).from_config(config, dtype=dtype)
    tensors = _read_safetensors(path)
    converted = set()  # the state keys filled from FP8 tensors
    for name, module in list(model.named_modules()):
        if _stacked_experts(module) and f"{name}.0.down_proj.weight_scale_inv" in tensors:
            model.set_submodule(name, _checkpoint_experts(name, module, tensors, block))
            converted |= {f"{name}.{p}{s}" for p in ("gate_up_proj", "down_proj") for s in ("", "_scale_inv")}
            continue
        scale = tensors.pop(f"{name}.weight_scale_inv", None)
        if scale is None:
            continue
        weight = tensors.pop(f"{name}.weight")
        if not isinstance(module, torch.nn.Linear) or weight.dtype != torch.float8_e4m3fn:
            raise NotImplementedError(f"from_pretrained: {name} ({type(module).__name__}) has a {weight.dtype} "
                                      "weight with scales; only e4m3fn linear layers and MoE experts load in FP8")
        model.set_submodule(name, FP8Linear.from_fp8(weight, scale, tensors.pop(f"{name}.bias", None), block))
        converted |= {f"{name}.weight", f"{name}.weight_scale_inv", f"{name}.bias"}
    for key in [k for k in tensors if k.endswith(".activation_scale")]:
        del tensors[key]
    for key, t in tensors.items():
        if t.dtype.itemsize == 1 and t.is_floating_point():
            raise NotImplementedError(f"from_pretrained: {key} ({t.dtype}) is not the weight of one of the "
                                      "model's linear layers or MoE experts with its weight_scale_inv")
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    state = model.state_dict(keep_vars=True)
    loaded = {id(state[k]) for k in tensors if k in state}
    missing = [k for k in missing if id(state[k]) not in loaded and k not in converted]
    if missing or unexpected:
        raise ValueError(f"from_pretrained: the checkpoint at {path} does not fit {type(model).__name__}: "
                         f"missing {missing}, unexpected {unexpected}")
    return model.eval()


def _checkpoint_experts(name: str, experts: torch.nn.Module, tensors: dict[str, torch.Tensor], block):
    """The FP8 experts ``name`` of a checkpoint, stored as the hub stores them, one expert at a time
    (``<name>.<e>.{gate,up,down}_proj.weight`` and ``weight_scale_inv``; the tensors are taken out of
    ``tensors``), stacked as transformers' loader stacks them: gate and up concatenated, their scales too."""
    from .nn import FP8Experts

    def take(proj: str, what: str) -> list[torch.Tensor]:
        keys = [f"{name}.{e}.{proj}.{what}" for e in range(experts.gate_up_proj.shape[0])]
        if any(k not in tensors for k in keys):
            raise ValueError(f"from_pretrained: the checkpoint holds FP8 experts {name} but not "
                             f"{next(k for k in keys if k not in tensors)}")
        return [tensors.pop(k).reshape(-1) if what == "weight_scale_inv" and block is None else tensors.pop(k)
                for k in keys]

    gate, up, down = (take(p, "weight") for p in ("gate_proj", "up_proj", "down_proj"))
    gate_scale, up_scale, down_scale = (take(p, "weight_scale_inv") for p in ("gate_proj", "up_proj", "down_proj"))
    if any(w.dtype != torch.float8_e4m3fn for w in gate + up + down):
        raise NotImplementedError(f"from_pretrained: {name} has experts whose weights are not float8_e4m3fn")
    return FP8Experts.from_fp8(torch.stack([torch.cat(p) for p in zip(gate, up)]),
                               torch.stack([torch.cat(p) for p in zip(gate_scale, up_scale)]), torch.stack(down),
                               torch.stack(down_scale), block, experts)


def _read_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint at ``path``, by name (safetensors only: nothing is unpickled)."""
    from safetensors.torch import load_file

    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for file in files:
        tensors.update(load_file(os.path.join(path, file)))
    return tensors


def _excluded(name: str, patterns: list[str]) -> bool:
    last = name.rpartition(".")[2]
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(last, p) for p in patterns)


def _kept_linear(linear: torch.nn.Linear, others: list[str]) -> str | None:
    """Why converting ``linear`` would break the model (``others``: the other modules holding its weight)."""
    if isinstance(linear, torch.nn.modules.linear.NonDynamicallyQuantizableLinear):
        return "its parent reads its weight directly (torch's NonDynamicallyQuantizableLinear)"
    if others:
        return f"its weight is tied to {', '.join(o or 'the model' for o in others)}"
    return None


def _stacked_experts(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds MoE experts as transformers 5 stacks them: 3-D gate_up_proj and down_proj."""
    return all(isinstance(getattr(module, p, None), torch.nn.Parameter) and getattr(module, p).dim() == 3
               for p in ("gate_up_proj", "down_proj"))


def _kept_experts(experts: torch.nn.Module) -> str | None:
    """Why :class:`mps_ext.nn.FP8Experts` cannot stand for ``experts`` (the flags are set by transformers'
    ``use_experts_implementation``), or None."""
    if not getattr(experts, "has_gate", True) or not hasattr(type(experts), "_apply_gate"):
        return "only gated experts (gate_up_proj with an _apply_gate) convert"
    if getattr(experts, "has_post_expert_norm", False):
        return "experts with a post-expert norm have no FP8 form yet"
    return None


def _fp8_experts(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds stacked e4m3fn experts with their scales, as transformers' FP8 ``FP8Experts``."""
    return (_stacked_experts(module) and module.gate_up_proj.dtype == torch.float8_e4m3fn
            and module.down_proj.dtype == torch.float8_e4m3fn and hasattr(module, "block_size")
            and all(isinstance(getattr(module, f"{p}_scale_inv", None), torch.Tensor)
                    for p in ("gate_up_proj", "down_proj")))


def _check_experts(name: str, experts: torch.nn.Module) -> None:
    why = _kept_experts(experts)
    if why is not None:
        raise NotImplementedError(f"convert: {name} ({type(experts).__name__}) holds FP8 experts that mps_ext "
                                  f"cannot adopt ({why}); pass exclude=[...] with its name to keep it as it is")


def _holds_fp8(module: torch.nn.Module) -> bool:
    tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
    return any(t.dtype.itemsize == 1 and t.is_floating_point() for t in tensors)


def _holds_fp8_weights(module: torch.nn.Module) -> bool:
    w = getattr(module, "weight", None)
    return (isinstance(w, torch.Tensor) and w.dtype in (torch.float8_e4m3fn, torch.uint8) and w.dim() == 2
            and isinstance(getattr(module, "weight_scale_inv", None), torch.Tensor) and hasattr(module, "block_size"))


def _scale_of(name: str, module: torch.nn.Module) -> torch.Tensor:
    """``module.weight_scale_inv``, checked against the shape its ``block_size`` implies."""
    scale, block = module.weight_scale_inv, module.block_size
    n, k = module.weight.shape
    if block is None:
        ok = scale.numel() in (1, n)
        want = f"one value or {n}"
    else:
        want = (-(-n // block[0]), -(-k // block[1]))
        ok = tuple(scale.shape) == want
    if not ok:
        raise ValueError(f"convert: {name}.weight_scale_inv has shape {tuple(scale.shape)}, expected {want} for "
                         f"a weight of shape {(n, k)} and block_size {block}")
    return scale


def _dequantized_weight(weight, weight_scale, block_size, dtype):
    if block_size is not None:
        return dequantize(weight, weight_scale, dtype, block=block_size)
    return dequantize(weight, weight_scale.reshape(()) if weight_scale.numel() == 1 else weight_scale.reshape(-1, 1),
                      dtype)


def _dequantized_experts(weight, weight_scale, block_size, dtype):
    """The (E, N, K) expert weights ``weight * weight_scale`` in ``dtype``."""
    if block_size is None:
        e, n, k = weight.shape
        scale = weight_scale.reshape(e, -1, 1).expand(e, n, 1)  # per expert or per channel
        return dequantize(weight.reshape(e * n, k), scale.reshape(e * n, 1), dtype).view(e, n, k)
    return torch.stack([dequantize(w, s, dtype, block=block_size) for w, s in zip(weight, weight_scale)])


def _grouped_setup(ctx, inputs, kwargs, output):
    x, weight, weight_scale, offs, block_size, _ = inputs
    ctx.save_for_backward(weight, weight_scale, offs)
    ctx.block_size = block_size


def _grouped_backward(ctx, grad):
    from ._ops import _zero_past

    weight, weight_scale, offs = ctx.saved_tensors
    grad_x = None
    if ctx.needs_input_grad[0]:
        w = _dequantized_experts(weight, weight_scale, ctx.block_size, grad.dtype)
        grad_x = _zero_past(torch.ops.mps_ext.grouped_mm(_zero_past(grad, offs, 0), w, offs), offs, 0)
    return grad_x, None, None, None, None, None


def _grouped_jvp(inputs, kwargs, out, tangents):
    # Linear in x and in weight_scale (the FP8 weight has no tangent).
    (x, weight, scale, offs, block, dtype), (t_x, _, t_scale, *_) = inputs, tangents
    op = torch.ops.mps_ext.fp8_grouped_mm
    return _autograd.tangent_sum([None if t_x is None else op(t_x, weight, scale, offs, block, dtype),
                                  None if t_scale is None else op(x, weight, t_scale, offs, block, dtype)], out)


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
    # Linear in each scale and in bias (scale_result only scales a float8 output, which rounds).
    (a, b, scale_a, scale_b, _, out_dtype, result), (_, _, t_a, t_b, t_bias, _, _) = inputs, tangents
    op = torch.ops.mps_ext.scaled_mm
    return _autograd.tangent_sum([None if t_a is None else op(a, b, t_a, scale_b, None, out_dtype, result),
                                  None if t_b is None else op(a, b, scale_a, t_b, None, out_dtype, result), t_bias],
                                 out)


def _dequantize_jvp(inputs, kwargs, out, tangents):
    q, _, block_rows, block_cols, dtype = inputs
    return torch.ops.mps_ext.fp8_dequantize(q, tangents[1], block_rows, block_cols, dtype)


def _no_setup(ctx, inputs, kwargs, output):
    pass


_autograd.register("fp8_linear", _linear_setup, _linear_backward, _linear_jvp)
_autograd.register("fp8_grouped_mm", _grouped_setup, _grouped_backward, _grouped_jvp)
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
def _(a, b, scale_a, scale_b, bias=None, out_dtype=None, scale_result=None):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or torch.bfloat16)


@torch.library.register_fake("mps_ext::fp8_linear")
def _(input, weight, weight_scale, bias=None, block_size=None):
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


@torch.library.register_fake("mps_ext::fp8_grouped_mm")
def _(x, weight, weight_scale, offs, block_size=None, out_dtype=None):
    from ._ops import _grouped_mm_layout

    torch._check(x.dim() == 2 and weight.dim() == 3, lambda: "fp8_grouped_mm: x must be 2-D and weight 3-D")
    size, stride = _grouped_mm_layout(x, weight.transpose(-2, -1), offs)
    return torch.empty_strided(size, stride, dtype=x.dtype, device=x.device)
