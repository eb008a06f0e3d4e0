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

import copy
import fnmatch
import json
import math
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
    Differentiable in ``input``, ``weight_scale`` and ``bias``, in both modes (the FP8 weight has no derivative).
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
    a tiled kernel that decodes them into its tiles. Differentiable in ``x`` and ``weight_scale``, in both modes (the
    FP8 weights have no derivative).
    """
    return torch.ops.mps_ext.fp8_grouped_mm(x, weight, weight_scale, offs,
                                            list(block_size) if block_size is not None else None, out_dtype)


# Hugging Face's FP8 recipes keep these in the model's dtype: the output projection (often tied to the
# embeddings) is where FP8 rounding shows most in the tokens.
DEFAULT_EXCLUDE = ("lm_head", "*embed*")


def convert(model: torch.nn.Module, granularity: str = "channel", block_size: tuple[int, int] = (128, 128),
            exclude: Iterable[str] = DEFAULT_EXCLUDE, include: Iterable[str] = ()) -> torch.nn.Module:
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
    - Linear layers whose class overrides ``nn.Linear.forward`` (routers that
      return routing weights with the product: Llama 4's ``Llama4Router``,
      PhiMoE's ``PhimoeTopKRouter``) stay as they are, with a warning: an
      ``FP8Linear`` would return the product alone.
    - ``include``: names or patterns (matched as ``exclude``'s) of such linear
      layers to convert all the same, for classes whose forward is the product
      (Falcon's ``FalconLinear``: ``x @ W.T + b``); an included layer runs
      ``FP8Linear``'s forward. ``ValueError`` if a pattern names no module.

    Raises ``NotImplementedError`` naming any other module that holds float8
    tensors (e5m2 weights, FP8 embeddings, FP8 experts without a gate, FP8
    linear layers with a forward of their own): they would be read as floats.
    Exclude them to keep them as they are.
    """
    from .nn import FP8Experts, FP8Linear

    patterns = [exclude] if isinstance(exclude, str) else list(exclude)
    included = [include] if isinstance(include, str) else list(include)
    owners: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for t in module.parameters(recurse=False):
            owners.setdefault(id(t), []).append(name)
    names = [name for name, _ in model.named_modules()]
    unmatched = [p for p in included if not any(_excluded(name, [p]) for name in names)]
    if unmatched:
        raise ValueError(f"convert: include={unmatched} names no module of {type(model).__name__}")

    # Every layer is checked and built before any is replaced: an error leaves the model as it was.
    plan = []

    def visit(module: torch.nn.Module, prefix: str) -> None:
        for child_name, child in module.named_children():
            name = f"{prefix}{child_name}"
            if isinstance(child, (FP8Experts, FP8Linear)) or _excluded(name, patterns):
                continue
            if _holds_fp8_weights(child):
                if _own_forward(child) and not _excluded(name, included):
                    raise NotImplementedError(f"convert: {name} ({type(child).__name__}) holds FP8 weights but runs a "
                                              "forward of its own class; pass exclude=[...] with its name to keep it "
                                              "as it is, or include=[...] to run it as a plain FP8 linear layer")
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
                why = _kept_linear(child, [o for o in owners.get(id(child.weight), []) if o != name],
                                   _excluded(name, included))
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
    ``AutoModelForCausalLM``) in ``dtype``, and the checkpoint's names are mapped onto it as transformers'
    loader maps them (the class's conversion mapping, each ``weight_scale_inv`` following its weight):
    experts stored one by one (Mixtral's and MiniMax-M2's ``block_sparse_moe.experts.<e>.w1/w3/w2``,
    Qwen3-MoE's and DeepSeek-V3's ``mlp.experts.<e>.{gate,up,down}_proj``) are stacked as transformers
    stacks them. Each linear layer with a ``weight_scale_inv`` becomes an :class:`mps_ext.nn.FP8Linear`
    holding the checkpoint's bytes and scales unchanged (partial blocks included), and such stacked experts
    an :class:`mps_ext.nn.FP8Experts`; a linear layer whose class overrides ``nn.Linear.forward`` (a
    router) gets its weight dequantized instead, with a warning. The rest (``modules_to_not_convert``,
    norms, embeddings) loads in ``dtype``. Static activation scales are not used: activations stay in
    ``dtype``. Every FP8 weight, scale and bias is checked against its layer (weights (out, in), experts
    (E, out, in), float scales on the ``weight_block_size`` grid): ``ValueError`` naming the tensor
    otherwise. The tensors of modules the model does not have (the multi-token-prediction layer
    ``model.layers.<num_hidden_layers>`` of DeepSeek-V3's and GLM-4.5's checkpoints) are not loaded, with a
    warning, as transformers' loader leaves them. A float8 tensor that is neither such a linear layer's
    weight nor such experts' raises ``NotImplementedError`` naming it. Nothing is downloaded: fetch a hub
    checkpoint first (``huggingface-cli download <id> --local-dir <path>``).
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
    block = None if block is None else tuple(block)
    model = (model_class or transformers.AutoModelForCausalLM).from_config(config, dtype=dtype)
    tensors, sources = _as_transformers_loads(model, _read_safetensors(path), block)
    converted = set()  # the state keys filled from FP8 tensors
    for name, module in list(model.named_modules()):
        if _stacked_experts(module) and f"{name}.gate_up_proj_scale_inv" in tensors:
            model.set_submodule(name, _checkpoint_experts(name, module, tensors, sources, block))
            converted |= {f"{name}.{p}{s}" for p in ("gate_up_proj", "down_proj") for s in ("", "_scale_inv")}
            continue
        scale = tensors.pop(f"{name}.weight_scale_inv", None)
        if scale is None:
            continue
        weight = tensors.pop(f"{name}.weight", None)
        if weight is None:
            raise ValueError(f"from_pretrained: the checkpoint holds {_described(sources, f'{name}.weight_scale_inv')}"
                             f" but no {name}.weight")
        if not isinstance(module, torch.nn.Linear) or weight.dtype != torch.float8_e4m3fn:
            raise NotImplementedError(f"from_pretrained: {name} ({type(module).__name__}) has a {weight.dtype} "
                                      "weight with scales; only e4m3fn linear layers and MoE experts load in FP8")
        layer = f"{name} ({type(module).__name__}({module.in_features}, {module.out_features}))"
        _expect(sources, f"{name}.weight", weight, (module.out_features, module.in_features), layer)
        why = _scale_mismatch(scale, *weight.shape, block)
        if why:
            raise ValueError(f"from_pretrained: {_described(sources, f'{name}.weight_scale_inv')} {why}")
        if _own_forward(module):
            warnings.warn(f"from_pretrained: {name} is loaded dequantized to {dtype}: its class "
                          f"{type(module).__name__} overrides nn.Linear.forward, which an FP8Linear would not run",
                          stacklevel=2)
            tensors[f"{name}.weight"] = _dequantized_weight(weight, scale, block, torch.float32)
            continue
        bias = tensors.pop(f"{name}.bias", None)
        if bias is not None:
            _expect(sources, f"{name}.bias", bias, (module.out_features,), layer)
        model.set_submodule(name, FP8Linear.from_fp8(weight, scale, bias, block))
        converted |= {f"{name}.weight", f"{name}.weight_scale_inv", f"{name}.bias"}
    for key in [k for k in tensors if k.endswith(".activation_scale")]:
        del tensors[key]
    for key, t in tensors.items():
        if t.dtype.itemsize == 1 and t.is_floating_point():
            raise NotImplementedError(f"from_pretrained: {_described(sources, key)} ({t.dtype}) is not the weight of "
                                      "one of the model's linear layers or MoE experts with its weight_scale_inv")
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    state = model.state_dict(keep_vars=True)
    loaded = {id(state[k]) for k in tensors if k in state}
    missing = [k for k in missing if id(state[k]) not in loaded and k not in converted]
    if missing or unexpected:
        raise ValueError(f"from_pretrained: the checkpoint at {path} does not fit {type(model).__name__}: "
                         f"missing {missing}, unexpected {unexpected}")
    return model.eval()


def _as_transformers_loads(model: torch.nn.Module, tensors: dict[str, torch.Tensor], block):
    """The checkpoint's ``tensors`` (taken out of the dict) under ``model``'s names, renamed and merged as
    transformers' loader does for the model's class (its conversion mapping: Mixtral's and MiniMax-M2's
    ``block_sparse_moe.experts.<e>.w1/w3/w2`` and Qwen3-MoE's, DeepSeek-V3's and GLM-4.5's
    ``mlp.experts.<e>.{gate,up,down}_proj`` are stacked into ``mlp.experts.gate_up_proj`` and ``down_proj``),
    each ``weight_scale_inv`` merged as its weight is, as transformers' FP8 quantizer merges them; and, for
    each, the checkpoint keys it was made of. The tensors of modules the model does not have
    (multi-token-prediction layers: ``model.layers.<num_hidden_layers>`` of DeepSeek-V3 and GLM-4.5) are left
    out with a warning, as transformers' loader leaves them."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, dot_natural_key, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    converters += [c.copy([s + "_scale_inv" for s in c._original_source_patterns],
                          [t + "_scale_inv" for t in c._original_target_patterns], operations=list(c.operations))
                   for c in converters if all(s.endswith(".weight") for s in c._original_source_patterns)]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    state = model.state_dict()
    # What the keys may become: rename_source_key adds or strips the base model's prefix to reach one of these.
    known = dict.fromkeys([*state, *(f"{k}_scale_inv" for k in state)], True)
    modules = {name for name, _ in model.named_modules()}
    out, sources, merges, skipped = {}, {}, {}, {}
    # Taken out of ``tensors`` so that each merge frees what it stacks: the checkpoint plus one merged tensor.
    for key in sorted(tensors, key=dot_natural_key):  # experts in their order, as transformers stacks them
        t = tensors.pop(key)
        renamed, pattern = rename_source_key(key, renamings, converters, model.base_model_prefix, known)
        if renamed not in known and key in known:  # a key that fits as it is keeps its name, as in transformers
            renamed, pattern = key, None
        absent = _absent_module(renamed, modules)
        if absent is not None:
            skipped.setdefault(absent, []).append(key)
        elif pattern is None:
            out[renamed], sources[renamed] = t, [key]
        else:
            if block is None and key.endswith(".weight_scale_inv") and t.numel() == 1:
                t = t.reshape(1, 1)  # per tensor: stacked and concatenated to (E, 2, 1), as transformers holds them
            merges.setdefault(renamed, copy.deepcopy(by_pattern[pattern])).add_tensor(renamed, key, pattern, t)
            sources.setdefault(renamed, []).append(key)
    for target, merge in merges.items():
        try:
            merged = merge.convert(target, model=model, config=model.config)
        except Exception as e:
            raise ValueError(f"from_pretrained: {_described(sources, target)} cannot be merged as transformers' "
                             f"loader merges it: {e}") from e
        for name, t in merged.items():
            out[name], sources[name] = t[0] if isinstance(t, list) else t, sources[target]
    if skipped:
        warnings.warn(f"from_pretrained: {type(model).__name__} has no module {', '.join(skipped)}: the checkpoint's "
                      f"{sum(map(len, skipped.values()))} tensors of it are not loaded, as transformers' loader does "
                      "not load them (multi-token-prediction layers, for one, are not part of transformers' models)",
                      stacklevel=3)
    return out, sources


def _absent_module(key: str, modules: set[str]) -> str | None:
    """The first module on the path of state key ``key`` that is not one of ``modules``, or None."""
    parts = key.split(".")[:-1]
    return next((".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) not in modules), None)


def _described(sources: dict[str, list[str]], key: str) -> str:
    """``key``, and the checkpoint tensors it was made of where they are named otherwise, for errors."""
    made_of = sources.get(key, [key])
    if made_of == [key]:
        return key
    if len(made_of) == 1:
        return f"{key} (the checkpoint's {made_of[0]})"
    return f"{key} (merged from the checkpoint's {made_of[0]} and {len(made_of) - 1} more)"


def _expect(sources: dict[str, list[str]], key: str, t: torch.Tensor, shape: tuple[int, ...], of: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"from_pretrained: {_described(sources, key)} has shape {tuple(t.shape)}, expected "
                         f"{tuple(shape)} for {of}")


def _checkpoint_experts(name: str, experts: torch.nn.Module, tensors: dict[str, torch.Tensor],
                        sources: dict[str, list[str]], block):
    """An :class:`mps_ext.nn.FP8Experts` for the float experts ``name`` of the model from the checkpoint's FP8
    ``<name>.gate_up_proj``, ``<name>.down_proj`` and their ``_scale_inv`` (taken out of ``tensors``), each checked
    against the experts' shapes (always (E, out, in) in FP8) and its scale grid."""
    from .nn import FP8Experts

    gate_up, down = (tuple(getattr(experts, p).shape) for p in ("gate_up_proj", "down_proj"))
    if getattr(experts, "is_transposed", False):
        gate_up, down = (s[:1] + s[:0:-1] for s in (gate_up, down))
    e, h, i = down
    if block is None:  # one scale per tensor: per half of gate_up_proj
        grids = (e, 2, 1), (e, 1, 1)
    else:
        bn, bk = block
        grids = (e, 2 * -(-i // bn), -(-h // bk)), (e, -(-h // bn), -(-i // bk))
    of = f"{name} ({type(experts).__name__}: {e} experts of {i} from {h})"
    parts = []
    for key, shape in ((f"{name}.gate_up_proj", gate_up), (f"{name}.gate_up_proj_scale_inv", grids[0]),
                       (f"{name}.down_proj", down), (f"{name}.down_proj_scale_inv", grids[1])):
        t = tensors.pop(key, None)
        if t is None:
            raise ValueError(f"from_pretrained: the checkpoint holds FP8 experts {name} but not {key}")
        _expect(sources, key, t, shape, of)
        if key.endswith("_scale_inv") and (not t.is_floating_point() or t.dtype.itemsize == 1):
            raise ValueError(f"from_pretrained: {_described(sources, key)} is {t.dtype}, expected float32")
        if not key.endswith("_scale_inv") and t.dtype != torch.float8_e4m3fn:
            raise NotImplementedError(f"from_pretrained: {_described(sources, key)} is {t.dtype}; only e4m3fn "
                                      "experts load in FP8")
        parts.append(t)
    return FP8Experts.from_fp8(*parts, block, experts)


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


def _kept_linear(linear: torch.nn.Linear, others: list[str], included: bool) -> str | None:
    """Why converting ``linear`` would break the model (``others``: the other modules holding its weight;
    ``included``: named by ``convert``'s ``include``)."""
    if isinstance(linear, torch.nn.modules.linear.NonDynamicallyQuantizableLinear):
        return "its parent reads its weight directly (torch's NonDynamicallyQuantizableLinear)"
    if others:
        return f"its weight is tied to {', '.join(o or 'the model' for o in others)}"
    if _own_forward(linear) and not included:
        return (f"its class {type(linear).__name__} overrides nn.Linear.forward; pass include=[...] with its name "
                "to convert it all the same")
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
    why = _scale_mismatch(module.weight_scale_inv, *module.weight.shape, module.block_size)
    if why:
        raise ValueError(f"convert: {name}.weight_scale_inv {why}")
    return module.weight_scale_inv


def _scale_mismatch(scale: torch.Tensor, n: int, k: int, block) -> str | None:
    """Why ``scale`` cannot be the ``weight_scale_inv`` of an (n, k) e4m3fn weight quantized per ``block``
    (None: one scale for the tensor or one per output channel), or None."""
    if not scale.is_floating_point() or scale.dtype.itemsize == 1:
        return f"is {scale.dtype}, expected float32"
    if block is None:
        if scale.numel() == 1 or tuple(scale.shape) in ((n,), (n, 1)):
            return None
        want = f"one value or {(n, 1)}"
    else:
        want = (-(-n // block[0]), -(-k // block[1]))
        if tuple(scale.shape) == want:
            return None
    return f"has shape {tuple(scale.shape)}, expected {want} for a weight of shape {(n, k)} and block_size {block}"


def _own_forward(module: torch.nn.Module) -> bool:
    """Whether the linear layer ``module`` runs a forward of its class's own, not a linear layer's product:
    routers that subclass ``nn.Linear`` return routing weights with it (Llama 4's ``Llama4Router``, PhiMoE's
    ``PhimoeTopKRouter``), transformers' ``FP8GroupedLinear`` splits its input into groups."""
    if not isinstance(module, torch.nn.Linear):
        return False
    owner = next(c for c in type(module).__mro__ if "forward" in vars(c))
    return owner is not torch.nn.Linear and not (owner.__name__ == "FP8Linear" and
                                                 owner.__module__ == "transformers.integrations.finegrained_fp8")


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


def _block_sums(t: torch.Tensor, block_n: int, block_k: int) -> torch.Tensor:
    """The sums of ``t`` (..., N, K) over each ``block_n x block_k`` block, the last ones partial:
    (..., ceil(N / block_n), ceil(K / block_k))."""
    n, k = t.shape[-2:]
    rows, cols = -(-n // block_n), -(-k // block_k)
    t = torch.nn.functional.pad(t, (0, cols * block_k - k, 0, rows * block_n - n))
    return t.reshape(*t.shape[:-2], rows, block_n, cols, block_k).sum((-3, -1))


def _scale_grad(grad_weight: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, block_size):
    """The gradient in ``weight_scale`` from ``grad_weight``, the one in the dequantized weight
    ``weight * weight_scale`` (..., N, K): each scale's is the sum, over the codes it scales, of the code times
    that code's gradient. A scale covers a block (``block_size``), a whole matrix (one value per tensor or
    expert) or an output channel, as the kernels read them."""
    n, k = weight.shape[-2:]
    if block_size is not None:
        block_n, block_k = block_size
    elif weight_scale.numel() == math.prod(weight.shape[:-2]):
        block_n, block_k = n, k
    else:
        block_n, block_k = 1, k
    codes = dequantize(weight, weight.new_ones((), dtype=torch.float32))
    sums = _block_sums(grad_weight * codes, max(block_n, 1), max(block_k, 1))
    return sums.reshape(weight_scale.shape).to(weight_scale.dtype)


def _grouped_setup(ctx, inputs, kwargs, output):
    x, weight, weight_scale, offs, block_size, _ = inputs
    # x only for weight_scale's gradient: frozen FP8 experts keep no activations alive.
    ctx.save_for_backward(weight, weight_scale, offs, x if ctx.needs_input_grad[2] else None)
    ctx.block_size = block_size


def _grouped_backward(ctx, grad):
    from ._ops import _zero_past

    weight, weight_scale, offs, x = ctx.saved_tensors
    grad_x = grad_scale = None
    if ctx.needs_input_grad[0]:
        w = _dequantized_experts(weight, weight_scale, ctx.block_size, grad.dtype)
        grad_x = _zero_past(torch.ops.mps_ext.grouped_mm(_zero_past(grad, offs, 0), w, offs), offs, 0)
    if ctx.needs_input_grad[2]:
        # Each expert's grad^T x over its rows (offs splitting the shared dimension), in float32: (E, N, K).
        grad_weight = torch.ops.mps_ext.grouped_mm(grad.float().t(), x.float(), offs)
        grad_scale = _scale_grad(grad_weight, weight, weight_scale, ctx.block_size)
    return grad_x, None, grad_scale, None, None, None


def _grouped_jvp(inputs, kwargs, out, tangents):
    # Linear in x and in weight_scale (the FP8 weight has no tangent).
    (x, weight, scale, offs, block, dtype), (t_x, _, t_scale, *_) = inputs, tangents
    op = torch.ops.mps_ext.fp8_grouped_mm
    return _autograd.tangent_sum([None if t_x is None else op(t_x, weight, scale, offs, block, dtype),
                                  None if t_scale is None else op(x, weight, t_scale, offs, block, dtype)], out)


def _linear_setup(ctx, inputs, kwargs, output):
    input, weight, weight_scale, bias, block_size = inputs
    # input only for weight_scale's gradient: a frozen FP8 layer keeps no activations alive.
    ctx.save_for_backward(weight, weight_scale, input if ctx.needs_input_grad[2] else None)
    ctx.block_size = block_size
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _linear_backward(ctx, grad):
    weight, weight_scale, input = ctx.saved_tensors
    grad_input = grad_scale = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_input = grad @ _dequantized_weight(weight, weight_scale, ctx.block_size, grad.dtype)
    if ctx.needs_input_grad[2]:
        grad_weight = grad.reshape(-1, grad.shape[-1]).float().t() @ input.reshape(-1, input.shape[-1]).float()
        grad_scale = _scale_grad(grad_weight, weight, weight_scale, ctx.block_size)
    if ctx.needs_input_grad[3]:
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0).to(ctx.bias_dtype)
    return grad_input, None, grad_scale, grad_bias, None


def _linear_jvp(inputs, kwargs, out, tangents):
    # Linear in input, weight_scale and bias (the FP8 weight has no tangent).
    (input, weight, scale, _, block), (t_input, _, t_scale, t_bias, _) = inputs, tangents
    op = torch.ops.mps_ext.fp8_linear
    return _autograd.tangent_sum([None if t_input is None else op(t_input, weight, scale, None, block),
                                  None if t_scale is None else op(input, weight, t_scale, None, block), t_bias], out)


def _scaled_mm_setup(ctx, inputs, kwargs, output):
    a, b, scale_a, scale_b, bias, out_dtype, _ = inputs
    ctx.save_for_backward(a, b, scale_a, scale_b)
    ctx.out_dtype = output.dtype
    ctx.bias = None if bias is None else (bias.shape, bias.dtype)


def _scaled_mm_backward(ctx, grad):
    # out = scale_a * scale_b * (a @ b) + bias, the scales broadcast (one value, or scale_a (M, 1) and
    # scale_b (1, N)): each scale's gradient sums grad * the other scale * a @ b over what it scales.
    if ctx.out_dtype.itemsize == 1:
        raise RuntimeError("mps_ext.scaled_mm has no backward (reverse-mode) derivative for a float8 output: "
                           "it rounds")
    a, b, scale_a, scale_b = ctx.saved_tensors
    grad = grad.float()
    grad_a = grad_b = grad_bias = None
    if ctx.needs_input_grad[2] or ctx.needs_input_grad[3]:
        # Ones of the scales' shapes, not batched where a scale is (vmap): the product once.
        ones = [torch.ones(s.shape, dtype=torch.float32, device=s.device) for s in (scale_a, scale_b)]
        weighted = grad * torch.ops.mps_ext.scaled_mm(a, b, *ones, None, torch.float32, None)
        if ctx.needs_input_grad[2]:
            grad_a = (weighted * scale_b).sum_to_size(scale_a.shape).to(scale_a.dtype)
        if ctx.needs_input_grad[3]:
            grad_b = (weighted * scale_a).sum_to_size(scale_b.shape).to(scale_b.dtype)
    if ctx.needs_input_grad[4]:
        grad_bias = grad.sum_to_size(ctx.bias[0]).to(ctx.bias[1])
    return None, None, grad_a, grad_b, grad_bias, None, None


def _scaled_mm_jvp(inputs, kwargs, out, tangents):
    # Linear in each scale and in bias (scale_result only scales a float8 output, which rounds).
    (a, b, scale_a, scale_b, _, out_dtype, result), (_, _, t_a, t_b, t_bias, _, _) = inputs, tangents
    op = torch.ops.mps_ext.scaled_mm
    return _autograd.tangent_sum([None if t_a is None else op(a, b, t_a, scale_b, None, out_dtype, result),
                                  None if t_b is None else op(a, b, scale_a, t_b, None, out_dtype, result), t_bias],
                                 out)


def _dequantize_setup(ctx, inputs, kwargs, output):
    q, scale, block_rows, block_cols, _ = inputs
    ctx.save_for_backward(q)
    ctx.blocks = (block_rows, block_cols)
    ctx.scale = (scale.shape, scale.dtype)


def _dequantize_backward(ctx, grad):
    (q,) = ctx.saved_tensors
    codes = torch.ops.mps_ext.fp8_dequantize(q, q.new_ones(ctx.scale[0], dtype=torch.float32), *ctx.blocks,
                                             torch.float32)
    grad_scale = _block_sums(grad.float() * codes, *ctx.blocks)
    return None, grad_scale.reshape(ctx.scale[0]).to(ctx.scale[1]), None, None, None


def _dequantize_jvp(inputs, kwargs, out, tangents):
    q, _, block_rows, block_cols, dtype = inputs
    return torch.ops.mps_ext.fp8_dequantize(q, tangents[1], block_rows, block_cols, dtype)


def _no_setup(ctx, inputs, kwargs, output):
    pass


# The FP8 products and dequantizing are linear in their float arguments (the float8 ones have no derivative);
# quantizing rounds: no derivative; nor has a scaled product's float8 output, which rounds, in reverse mode.
_autograd.register("fp8_linear", _linear_setup, _linear_backward, _linear_jvp)
_autograd.register("fp8_grouped_mm", _grouped_setup, _grouped_backward, _grouped_jvp)
_autograd.register("fp8_quantize", _no_setup)
_autograd.register("fp8_dequantize", _dequantize_setup, _dequantize_backward, _dequantize_jvp)
_autograd.register("scaled_mm", _scaled_mm_setup, _scaled_mm_backward, _scaled_mm_jvp)


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
