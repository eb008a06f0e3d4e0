"""transformers' models in FP8 for the tests: tiny MoE models built from configs, their dequantized twins, and
Hugging Face's fine-grained FP8 format written with torch alone (block quantization as its recipes do it,
checkpoints as the hub stores them, MoE experts one by one, in the model's names or in the hub's names that
transformers' save_pretrained gives them)."""

import fnmatch
import json

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file

from mps_ext.nn import FP8Experts, FP8Linear

F8 = torch.float8_e4m3fn
BLOCK = (128, 128)
PROMPT = torch.tensor([[3, 141, 59, 26, 5]])


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


def write_hub_fp8_checkpoint(model, path, not_converted, extra=None, **config):
    """``model`` saved in Hugging Face's fine-grained FP8 format with the names the hub's checkpoints have: the
    layout of transformers' own ``save_pretrained``, which reverses its conversion mapping (Mixtral's
    ``block_sparse_moe.experts.<e>.w1/w3/w2``, Qwen3-MoE's ``mlp.experts.<e>.gate_proj``, ...), plus the
    ``extra`` tensors, with ``config`` set in its config.json. Every 2-D weight but the embeddings and the
    modules matching ``not_converted`` (``fnmatch`` patterns of those names) is in 128 x 128 blocks. Returns
    the checkpoint's tensors and its dequantized twin as transformers' own loader loads it (from the same
    tensors as floats, in the same layout, under ``path / "float"``)."""
    floats = path / "float"
    model.save_pretrained(floats)
    tensors, dequantized = {}, {}
    for name, t in {**load_file(str(floats / "model.safetensors")), **(extra or {})}.items():
        module, _, param = name.rpartition(".")
        if param == "weight" and t.dim() == 2 and "embed" not in name and not any(
                fnmatch.fnmatchcase(module, p) for p in not_converted):
            tensors[name], tensors[f"{module}.weight_scale_inv"], dequantized[name] = quantized(t)
        else:
            tensors[name] = dequantized[name] = t
    save_file(tensors, str(path / "model.safetensors"))
    save_file(dequantized, str(floats / "model.safetensors"))
    settings = {**json.loads((floats / "config.json").read_text()), **config}
    (floats / "config.json").write_text(json.dumps(settings))
    settings["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                       "weight_block_size": list(BLOCK), "modules_to_not_convert": not_converted}
    (path / "config.json").write_text(json.dumps(settings))
    return tensors, transformers.AutoModelForCausalLM.from_pretrained(floats, dtype=torch.float32).eval()


def tiny_moe(arch: str, **overrides):
    """A tiny MoE model of transformers' class for ``arch`` (8 experts of 48 from 64, top 2; Llama 4: 4 experts),
    random weights; ``overrides``: config entries."""
    torch.manual_seed(7)
    common = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, max_position_embeddings=64, tie_word_embeddings=False, num_experts_per_tok=2)
    mixtral_like = dict(num_local_experts=8, intermediate_size=48)
    configs = {
        "qwen3_moe": (transformers.Qwen3MoeConfig, dict(num_experts=8, moe_intermediate_size=48)),
        "mixtral": (transformers.MixtralConfig, mixtral_like),
        "minimax_m2": (transformers.MiniMaxM2Config, mixtral_like),
        "phimoe": (transformers.PhimoeConfig, mixtral_like),  # its router subclasses nn.Linear
        # multi-head latent attention, a shared expert, every layer MoE
        "deepseek_v3": (transformers.DeepseekV3Config, dict(num_key_value_heads=4, head_dim=8, n_routed_experts=8,
                                                            moe_intermediate_size=48, first_k_dense_replace=0,
                                                            q_lora_rank=48, kv_lora_rank=32, qk_rope_head_dim=8,
                                                            qk_nope_head_dim=16, v_head_dim=16, n_group=2,
                                                            topk_group=1)),
        "glm4_moe": (transformers.Glm4MoeConfig, dict(n_routed_experts=8, moe_intermediate_size=48,
                                                      intermediate_size=96, first_k_dense_replace=0)),
        # its router subclasses nn.Linear; its experts are stacked (E, in, out) and have no _apply_gate
        "llama4": (transformers.Llama4TextConfig, dict(num_local_experts=4, intermediate_size=48,
                                                       intermediate_size_mlp=96)),
        "gpt_oss": (transformers.GptOssConfig, dict(mixtral_like, rope_parameters={"rope_type": "default",
                                                                                  "rope_theta": 10000.0})),
    }
    config_class, specific = configs[arch]
    config = config_class(**{**common, **specific, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # gpt-oss initializes its expert biases to zero: make them count
        for name, t in model.named_parameters():
            if name.endswith("_proj_bias"):
                t.normal_(0, 0.5)
    return model


def dequantized_twin(model, converted):
    """``model`` (as it was before conversion) holding the converted model's FP8 weights as floats."""
    with torch.no_grad():
        for name, m in converted.named_modules():
            mine = model.get_submodule(name)
            if isinstance(m, FP8Linear):
                mine.weight.copy_(m.weight.view(F8).float() * m.weight_scale_inv)
            elif isinstance(m, FP8Experts):
                for p in ("gate_up_proj", "down_proj"):
                    w = dequantized_experts(getattr(m, p), getattr(m, f"{p}_scale_inv"), m.block_size)
                    getattr(mine, p).copy_(w.transpose(1, 2) if getattr(mine, "is_transposed", False) else w)
    return model


def dequantized_experts(q, scale, block):
    if block is None:
        return q.view(F8).float() * scale
    full = scale.repeat_interleave(block[0], 1).repeat_interleave(block[1], 2)
    return q.view(F8).float() * full[:, : q.shape[1], : q.shape[2]]
