"""Hugging Face's fine-grained FP8 format written with torch alone, for the tests of transformers' models in FP8:
block quantization as its recipes do it, and checkpoints as the hub stores them (MoE experts one by one)."""

import json

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

F8 = torch.float8_e4m3fn
BLOCK = (128, 128)


def block_quantize(w: torch.Tensor, block=BLOCK):
    """Hugging Face's FP8 recipe in torch alone: per block, scale = amax / 448, q = e4m3fn(w / scale)."""
    br, bc = block
    amax = F.pad(w.float().abs(), (0, -w.shape[1] % bc, 0, -w.shape[0] % br))
    amax = amax.unflatten(0, (-1, br)).unflatten(2, (-1, bc)).amax((1, 3))
    scale = torch.where(amax == 0, torch.ones_like(amax), amax / 448)
    return (w.float() / expand(scale, w.shape, block)).to(F8), scale


def expand(scale: torch.Tensor, shape, block=BLOCK) -> torch.Tensor:
    return scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[: shape[0], : shape[1]]


def quantized(w: torch.Tensor, block=BLOCK):
    """``(q, scale, q * scale)`` of a 2-D ``w`` by :func:`block_quantize` (``block`` None: one scale)."""
    block = block or tuple(w.shape)
    q, s = block_quantize(w, block)
    return q, s, q.float() * expand(s, w.shape, block)


def quantized_experts(gate_up: torch.Tensor, down: torch.Tensor, block=BLOCK):
    """Stacked experts (E, 2I, H) and (E, H, I) quantized as an FP8 checkpoint stores them, each expert's gate,
    up and down projections apart (``block`` None: one scale each): ``{"gate_proj": [(q, scale, dequantized) per expert], "up_proj": ...}``."""
    half = gate_up.shape[1] // 2
    return {"gate_proj": [quantized(w[:half], block) for w in gate_up],
            "up_proj": [quantized(w[half:], block) for w in gate_up],
            "down_proj": [quantized(w, block) for w in down]}


def write_fp8_checkpoint(model, path, not_converted, shards=1):
    """``model`` saved in Hugging Face's fine-grained FP8 format (in ``shards`` files with an index when more
    than one), stacked MoE experts as ``<experts>.<e>.{gate,up,down}_proj.weight`` with their scales; returns
    the checkpoint's tensors and its dequantized twin's state."""
    tensors, dequantized = {}, {}
    state = model.state_dict()
    for name, t in state.items():
        module, _, param = name.rpartition(".")
        if param == "gate_up_proj" and module not in not_converted:
            parts = quantized_experts(t, state[f"{module}.down_proj"])
            for proj, experts in parts.items():
                for e, (q, s, _) in enumerate(experts):
                    tensors[f"{module}.{e}.{proj}.weight"], tensors[f"{module}.{e}.{proj}.weight_scale_inv"] = q, s
            dequantized[name] = torch.stack([torch.cat([g[2], u[2]]) for g, u in zip(parts["gate_proj"],
                                                                                   parts["up_proj"])])
            dequantized[f"{module}.down_proj"] = torch.stack([d[2] for d in parts["down_proj"]])
        elif param == "down_proj" and t.dim() == 3 and module not in not_converted:
            continue  # written with gate_up_proj
        elif param == "weight" and t.dim() == 2 and module not in not_converted and "embed" not in name:
            tensors[name], tensors[f"{module}.weight_scale_inv"], dequantized[name] = quantized(t)
        else:
            tensors[name] = dequantized[name] = t.contiguous()
    if model.config.tie_word_embeddings:
        del tensors["lm_head.weight"]
    if shards == 1:
        save_file(tensors, str(path / "model.safetensors"))
    else:
        names = sorted(tensors)
        files = {n: f"model-{i % shards + 1:05d}-of-{shards:05d}.safetensors" for i, n in enumerate(names)}
        for file in set(files.values()):
            save_file({n: tensors[n] for n in names if files[n] == file}, str(path / file))
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": files}))
    model.config.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "weight_block_size": list(BLOCK), "modules_to_not_convert": not_converted}
    (path / "config.json").write_text(json.dumps(config))
    return tensors, dequantized
