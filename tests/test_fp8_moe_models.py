"""FP8 Mixture-of-Experts with transformers' own classes (tiny models built from configs, random weights):
`fp8.convert` turns the stacked experts of Qwen3-MoE, Mixtral, DeepSeek-V3 and gpt-oss (stored (E, K, N), with
biases and its own gate) into FP8Experts and adopts transformers' FP8 experts with their bytes;
`fp8.from_pretrained` loads an FP8 MoE checkpoint written as the hub stores them (experts one by one, 128 x 128
blocks, partial ones included) with its bytes. Each decodes the tokens of its dequantized twin, run by torch,
on the FP8 grouped kernels. Checkpoints in the names of the hub's (Mixtral's, MiniMax-M2's and PhiMoE's
block_sparse_moe experts, DeepSeek-V3's and GLM-4.5's multi-token-prediction layer) load as transformers loads
them, experts' scales that do not fit are refused, routers that subclass nn.Linear (Llama 4, PhiMoE) keep their
class, and converted models survive state_dict and torch.save round trips."""

import copy
import json

import pytest
import torch

pytest.importorskip("transformers", reason='needs transformers: pip install "mps_ext[demo]"')

import transformers  # noqa: E402
from hf_fp8 import (BLOCK, F8, PROMPT, dequantized_twin, quantized, quantized_experts, tiny_moe,  # noqa: E402
                    write_fp8_checkpoint, write_hub_fp8_checkpoint)
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers.integrations.finegrained_fp8 import FP8Experts as HFFP8Experts  # noqa: E402
from transformers.integrations.finegrained_fp8 import FP8Linear as HFFP8Linear  # noqa: E402
from transformers.integrations.finegrained_fp8 import replace_with_fp8_linear  # noqa: E402

import mps_ext  # noqa: E402
from mps_ext import fp8  # noqa: E402
from mps_ext.nn import FP8Experts, FP8Linear  # noqa: E402
from conftest import backend, run_python  # noqa: E402
from tolerances import assert_close_normwise  # noqa: E402


def fp8_share(layers: torch.nn.Module) -> float:
    """The share of the elements of ``layers``' parameters and buffers held in FP8 (scales count as not)."""
    tensors = [*layers.parameters(), *layers.buffers()]
    return sum(t.numel() for t in tensors if t.dtype in (torch.uint8, F8)) / sum(t.numel() for t in tensors)


def assert_decodes_like(model, reference, steps=3, device="cpu"):
    """Greedy decoding of ``model`` on ``device`` gives ``reference``'s tokens and logits (on the CPU), its
    experts on the streamed FP8 decode kernel (the prompt's 10 expert rows over 8 experts are few enough too)."""
    want = reference.generate(PROMPT, max_new_tokens=steps, do_sample=False, output_logits=True,
                              return_dict_in_generate=True)
    model.to(device)
    with mps_ext.trace() as t:
        got = model.generate(PROMPT.to(device), max_new_tokens=steps, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    assert torch.equal(got.sequences.cpu(), want.sequences)
    for g, w in zip(got.logits, want.logits):
        assert_close_normwise(g.cpu(), w)
    layers = sum(isinstance(m, FP8Experts) for m in model.modules())
    assert layers and t.names.count("fp8_grouped_mm_stream8_float") == steps * layers * 2  # gate/up and down
    assert all(k.backend == backend(device) for k in t.kernels), t.kernels


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "deepseek_v3", "gpt_oss"])
def test_converted_moe_model_decodes_on_fp8_grouped_kernels(arch, device):
    model = tiny_moe(arch)
    converted = fp8.convert(copy.deepcopy(model))
    experts = [m for m in converted.modules() if isinstance(m, FP8Experts)]
    assert len(experts) == 2 and fp8_share(converted.model.layers) >= 0.95
    assert all(e.gate_up_proj.shape == (8, 96, 64) and e.down_proj.shape == (8, 64, 48) for e in experts)
    assert all((e.down_proj_bias is not None) == (arch == "gpt_oss") for e in experts)
    assert_decodes_like(converted, dequantized_twin(model, converted), device=device)


def test_convert_excludes_experts_and_converts_in_blocks():
    model = fp8.convert(tiny_moe("qwen3_moe"), granularity="block", block_size=(32, 32),
                        exclude=["model.layers.1.mlp.experts"])
    assert isinstance(model.model.layers[0].mlp.experts, FP8Experts)
    assert type(model.model.layers[1].mlp.experts).__name__ == "Qwen3MoeExperts"
    assert model.model.layers[0].mlp.experts.gate_up_proj_scale_inv.shape == (8, 3, 2)  # 96 x 64 in 32 x 32
    assert model.model.layers[0].mlp.experts.down_proj_scale_inv.shape == (8, 2, 2)


def hf_fp8_model(model, block):
    """``model`` with transformers' own FP8 layers (FP8Linear, FP8Experts) put in by its FP8 loader's
    ``replace_with_fp8_linear``, filled as that loader fills them from a checkpoint quantized per ``block``
    (None: one scale per tensor, per half of gate/up); returns it and its dequantized twin."""
    config = transformers.FineGrainedFP8Config(weight_block_size=block, modules_to_not_convert=["lm_head"])
    hf = replace_with_fp8_linear(copy.deepcopy(model), ["lm_head"], config)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for name, m in hf.named_modules():
            mine = twin.get_submodule(name)
            if isinstance(m, HFFP8Linear):
                q, s, mine.weight.data = quantized(mine.weight, block)
                m.weight, m.weight_scale_inv = fixed(q), fixed(s.reshape(m.weight_scale_inv.shape))
            elif isinstance(m, HFFP8Experts):
                parts = quantized_experts(mine.gate_up_proj, mine.down_proj, block)
                for p, halves in (("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))):
                    q, s, deq = (torch.stack([torch.cat([parts[h][e][i] for h in halves]) for e in range(8)])
                                 for i in range(3))
                    setattr(m, p, fixed(q))
                    setattr(m, f"{p}_scale_inv", fixed(s.reshape(getattr(m, f"{p}_scale_inv").shape)))
                    getattr(mine, p).copy_(deq)
    return hf, twin


def fixed(t: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t, requires_grad=False)


@pytest.mark.parametrize("block", [BLOCK, None])
def test_convert_adopts_transformers_fp8_experts(block):
    hf, reference = hf_fp8_model(tiny_moe("qwen3_moe"), block)
    theirs = hf.model.layers[0].mlp.experts
    weights = theirs.gate_up_proj, theirs.down_proj
    fp8.convert(hf)
    mine = hf.model.layers[0].mlp.experts
    assert isinstance(mine, FP8Experts) and isinstance(hf.model.layers[0].self_attn.q_proj, FP8Linear)
    # The same bytes, shared; gate and up (48 rows each) keep their own scales in blocks of gcd(48, 128) rows.
    assert mine.gate_up_proj.data_ptr() == weights[0].data_ptr() and mine.down_proj.data_ptr() == weights[1].data_ptr()
    assert mine.block_size == (None if block is None else (16, 128))
    assert_decodes_like(hf, reference)


def test_from_pretrained_loads_fp8_experts_with_the_checkpoints_bytes(tmp_path):
    model = tiny_moe("qwen3_moe")
    routers = [f"model.layers.{i}.mlp.gate" for i in range(2)]  # as Qwen3-MoE's FP8 checkpoints keep them
    tensors, dequantized = write_fp8_checkpoint(model, tmp_path, ["lm_head", *routers])
    loaded = fp8.from_pretrained(tmp_path, dtype=torch.float32)
    for layer in range(2):
        name = f"model.layers.{layer}.mlp.experts"
        experts = loaded.get_submodule(name)
        assert isinstance(experts, FP8Experts) and experts.block_size == (16, 128)
        for e in range(8):
            gate_up = experts.gate_up_proj[e].view(F8)
            for part, rows in (("gate_proj", gate_up[:48]), ("up_proj", gate_up[48:]),
                               ("down_proj", experts.down_proj[e].view(F8))):
                assert torch.equal(rows.view(torch.uint8), tensors[f"{name}.{e}.{part}.weight"].view(torch.uint8))
            # Scales unchanged: each half's one block row of 128 spread over 3 rows of 16, down's over 4.
            scale = {p: tensors[f"{name}.{e}.{p}.weight_scale_inv"] for p in ("gate_proj", "up_proj", "down_proj")}
            assert torch.equal(experts.gate_up_proj_scale_inv[e], torch.cat([scale["gate_proj"]] * 3 +
                                                                            [scale["up_proj"]] * 3))
            assert torch.equal(experts.down_proj_scale_inv[e], torch.cat([scale["down_proj"]] * 4))
    model.load_state_dict(dequantized)
    assert_decodes_like(loaded, model)


def test_fp8_experts_refuse_scales_that_do_not_fit():
    hf, _ = hf_fp8_model(tiny_moe("qwen3_moe"), BLOCK)
    theirs = hf.model.layers[0].mlp.experts
    with pytest.raises(ValueError, match=r"gate_up_proj_scale_inv has shape \(8, 1, 1\), expected \(8, 2, 1\)"):
        FP8Experts.from_fp8(theirs.gate_up_proj, theirs.gate_up_proj_scale_inv[:, :1], theirs.down_proj,
                            theirs.down_proj_scale_inv, BLOCK, theirs)
    with pytest.raises(ValueError, match="gate_up_proj_scale_inv of shape \\(8, 3, 1\\) has neither"):
        FP8Experts.from_fp8(theirs.gate_up_proj, torch.ones(8, 3, 1), theirs.down_proj, torch.ones(8, 1, 1), None,
                            theirs)
    with pytest.raises(ValueError, match=r"down_proj_scale_inv has shape \(8, 1, 2\), expected \(8, 1, 1\)"):
        FP8Experts.from_fp8(theirs.gate_up_proj, theirs.gate_up_proj_scale_inv, theirs.down_proj, torch.ones(8, 1, 2),
                            BLOCK, theirs)


def test_bytes_per_parameter_of_qwen3_30b_a3b_from_its_config():
    """README's numbers: Qwen3-30B-A3B's shapes (its config.json) built on the meta device, where ``convert``
    runs on shapes alone (the FP8 ops' fake kernels): nothing allocated, nothing downloaded."""
    config = transformers.Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                         moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
                                         num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                                         max_position_embeddings=40960, tie_word_embeddings=False)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    decoder = sum(p.numel() for p in model.model.layers.parameters())

    def per_param(m):
        return (round(nbytes(m) / params, 3), round(nbytes(m.model.layers) / decoder, 4), round(nbytes(m) / 2**30, 2))

    assert params == 30_532_122_624 and per_param(model) == (2.0, 2.0, 56.87)
    channel = fp8.convert(copy.deepcopy(model))
    experts = channel.model.layers[47].mlp.experts
    assert isinstance(experts, FP8Experts) and experts.down_proj.shape == (128, 2048, 768)
    assert per_param(channel) == (1.024, 1.0034, 29.11)
    assert per_param(fp8.convert(copy.deepcopy(model), granularity="block")) == (1.021, 1.0007, 29.03)


def nbytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


# ------------------------------------------------- checkpoints as the hub names them

@pytest.mark.parametrize("arch, expert", [("mixtral", "block_sparse_moe.experts.7.w3"),
                                          ("minimax_m2", "block_sparse_moe.experts.7.w3"),
                                          ("phimoe", "block_sparse_moe.experts.7.w3"),
                                          ("qwen3_moe", "mlp.experts.7.up_proj")])
def test_from_pretrained_maps_expert_names_as_transformers_does(tmp_path, arch, expert):
    """Experts stored one by one under the names their hub checkpoints use (Mixtral, MiniMax-M2, PhiMoE: w1 the
    gate, w3 the up, w2 the down projection), stacked as transformers' own loader stacks them."""
    routers = ["*.gate"]  # the hub's name of the routers, which FP8 checkpoints keep unquantized
    tensors, reference = write_hub_fp8_checkpoint(tiny_moe(arch), tmp_path, ["lm_head", *routers])
    up = tensors[f"model.layers.1.{expert}.weight"]
    assert up.dtype == F8 and up.shape == (48, 64) and f"model.layers.1.{expert}.weight_scale_inv" in tensors
    loaded = fp8.from_pretrained(tmp_path, dtype=torch.float32)
    experts = loaded.model.layers[1].mlp.experts
    assert isinstance(experts, FP8Experts) and experts.block_size == (16, 128)
    assert torch.equal(experts.gate_up_proj[7, 48:], up.view(torch.uint8))  # expert 7's up half, bit for bit
    assert_decodes_like(loaded, reference)


@pytest.mark.parametrize("arch", ["deepseek_v3", "glm4_moe"])
def test_from_pretrained_leaves_out_the_multi_token_prediction_layer(tmp_path, arch):
    """DeepSeek-V3's and GLM-4.5's checkpoints hold a multi-token-prediction layer after the last decoder layer,
    model.layers.<num_hidden_layers> (a decoder layer with eh_proj, enorm, hnorm and a shared head), which
    transformers' models do not have and its loader does not load."""
    model = tiny_moe(arch, num_hidden_layers=3)  # its last layer is the checkpoint's multi-token-prediction layer
    h, mtp = model.config.hidden_size, "model.layers.2"
    gen = torch.Generator().manual_seed(8)
    extra = {f"{mtp}.eh_proj.weight": torch.randn(h, 2 * h, generator=gen) * 0.02,
             f"{mtp}.shared_head.head.weight": torch.randn(256, h, generator=gen) * 0.02,
             **{f"{mtp}.{norm}.weight": torch.ones(h) for norm in ("enorm", "hnorm", "shared_head.norm")}}
    tensors, reference = write_hub_fp8_checkpoint(model, tmp_path, ["lm_head", "*.gate"], extra,
                                                  num_hidden_layers=2, num_nextn_predict_layers=1)
    assert tensors[f"{mtp}.eh_proj.weight"].dtype == F8 and tensors[f"{mtp}.mlp.experts.0.gate_proj.weight"].dtype == F8
    with pytest.warns(UserWarning, match=rf"has no module {mtp}: the checkpoint's \d+ tensors of it are not loaded"):
        loaded = fp8.from_pretrained(tmp_path, dtype=torch.float32)
    assert len(loaded.model.layers) == 2
    assert_decodes_like(loaded, reference)


def test_from_pretrained_checks_experts_against_their_layer(tmp_path):
    """A transposed block grid of the experts' scales (each expert's down projection, 64 x 160: one block row
    of two) is refused, naming the tensor transformers' loader merged it into and where it came from."""
    model = tiny_moe("qwen3_moe", moe_intermediate_size=160)
    tensors, _ = write_hub_fp8_checkpoint(model, tmp_path, ["lm_head", "*.gate"])
    for e in range(8):
        scale = f"model.layers.0.mlp.experts.{e}.down_proj.weight_scale_inv"
        assert tensors[scale].shape == (1, 2)
        tensors[scale] = tensors[scale].t().contiguous()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts\.down_proj_scale_inv \(merged from the "
                                         r"checkpoint's model\.layers\.0\.mlp\.experts\.0\.down_proj\.weight_scale_inv "
                                         r"and 7 more\) has shape \(8, 2, 1\), expected \(8, 1, 2\)"):
        fp8.from_pretrained(tmp_path, dtype=torch.float32)


# ---------------------------------------------------------- routers, saving

@pytest.mark.parametrize("arch, router", [("llama4", "feed_forward.router"), ("phimoe", "mlp.router")])
def test_convert_leaves_routers_that_subclass_linear(arch, router):
    """Llama 4's and PhiMoE's routers subclass nn.Linear and return routing weights with the product: they stay
    as they are (Llama 4's experts too: they have no gate of transformers' experts), the rest runs in FP8."""
    model = tiny_moe(arch)
    with pytest.warns(UserWarning, match=r"stays torch\.float32: (its class \w+Router overrides nn\.Linear\.forward"
                                         r"|only gated experts)") as caught:
        converted = fp8.convert(copy.deepcopy(model))
    assert [str(w.message).partition(" stays")[0] for w in caught if "Router" in str(w.message)] == [
        f"convert: model.layers.{i}.{router}" for i in range(2)]
    assert type(converted.get_submodule(f"model.layers.1.{router}")) is type(model.get_submodule(
        f"model.layers.1.{router}"))
    assert isinstance(converted.model.layers[1].self_attn.q_proj, FP8Linear)
    reference = dequantized_twin(model, converted)
    if arch == "phimoe":
        assert_decodes_like(converted, reference)
    else:
        with mps_ext.trace() as t:
            got = converted.generate(PROMPT, max_new_tokens=3, do_sample=False)
        assert torch.equal(got, reference.generate(PROMPT, max_new_tokens=3, do_sample=False))
        assert "fp8_linear_gemv_stream_float" in t.names


def fp8_bits_as_float8(state: dict) -> dict:
    """A state dict's FP8 bytes as float8_e4m3fn tensors, as FP8 checkpoints store them."""
    return {k: v.view(F8) if v.dtype == torch.uint8 else v.contiguous() for k, v in state.items()}


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_converted_moe_model_state_dict_round_trips(tmp_path, arch):
    converted = fp8.convert(tiny_moe(arch))
    save_file(fp8_bits_as_float8(converted.state_dict()), str(tmp_path / "model.safetensors"))
    fresh = fp8.convert(tiny_moe(arch))
    for t in fresh.state_dict().values():
        t.zero_()
    fresh.load_state_dict(load_file(str(tmp_path / "model.safetensors")))
    mine, theirs = converted.model.layers[0].mlp.experts, fresh.model.layers[0].mlp.experts
    assert theirs.gate_up_proj.dtype == torch.uint8 and torch.equal(theirs.gate_up_proj, mine.gate_up_proj)
    assert torch.equal(fresh.generate(PROMPT, max_new_tokens=3, do_sample=False),
                       converted.generate(PROMPT, max_new_tokens=3, do_sample=False))


def test_converted_moe_models_load_with_torch_load_in_a_fresh_process(tmp_path):
    """torch.save of a whole converted model, torch.load in another process (the default gate of transformers'
    experts and gpt-oss's own clamped SwiGLU, both the experts' class's)."""
    want = {}
    for arch in ("qwen3_moe", "gpt_oss"):
        converted = fp8.convert(tiny_moe(arch))
        want[arch] = converted.generate(PROMPT, max_new_tokens=3, do_sample=False).tolist()
        torch.save(converted, tmp_path / f"{arch}.pt")
    result = run_python(f"""
import json, torch
from mps_ext.nn import FP8Experts
got = {{}}
for arch in {list(want)}:
    model = torch.load({str(tmp_path)!r} + f"/{{arch}}.pt", weights_only=False)
    assert isinstance(model.model.layers[1].mlp.experts, FP8Experts)
    got[arch] = model.generate(torch.tensor({PROMPT.tolist()}), max_new_tokens=3, do_sample=False).tolist()
print(json.dumps(got))
""", timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == want


def test_from_pretrained_dequantizes_fp8_routers_that_subclass_linear(tmp_path):
    """A checkpoint's FP8 weight of a router whose class subclasses nn.Linear (Llama 4's, returning routing
    weights with the product) is dequantized into the router, which an FP8Linear could not stand for."""
    tensors, reference = write_hub_fp8_checkpoint(tiny_moe("llama4"), tmp_path, ["lm_head"])
    router = "model.layers.1.feed_forward.router"
    assert tensors[f"{router}.weight"].dtype == F8
    with pytest.warns(UserWarning, match=r"model\.layers\.\d\.feed_forward\.router is loaded dequantized to "
                                         r"torch\.float32: its class Llama4Router overrides nn\.Linear\.forward"):
        loaded = fp8.from_pretrained(tmp_path, dtype=torch.float32)
    assert type(loaded.get_submodule(router)).__name__ == "Llama4Router"
    assert torch.equal(loaded.get_submodule(router).weight, reference.get_submodule(router).weight)
    assert isinstance(loaded.model.layers[1].feed_forward.shared_expert.up_proj, FP8Linear)
    with mps_ext.trace() as t:
        got = loaded.generate(PROMPT, max_new_tokens=3, do_sample=False)
    assert torch.equal(got, reference.generate(PROMPT, max_new_tokens=3, do_sample=False))
    assert "fp8_linear_gemv_stream_float" in t.names
