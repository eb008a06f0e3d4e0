"""FP8 linear layers with transformers' own classes: `fp8.convert` adopts transformers' FP8Linear layers (bytes and
scales kept), excludes and leaves alone what it must (linear subclasses with a forward of their own unless
included); `fp8.from_pretrained` loads a checkpoint written in Hugging Face's fine-grained FP8 format (tiny Llama
and Qwen3 built from configs, 128 x 128 blocks, partial ones included) with its FP8 bytes, and decodes the tokens
its dequantized reference decodes, and refuses FP8 tensors that do not fit their layer."""

import copy

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers", reason='needs transformers: pip install "mps_ext[demo]"')

import transformers  # noqa: E402
from hf_fp8 import BLOCK, PROMPT, block_quantize, dequantized_twin, expand, write_fp8_checkpoint  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers.integrations.finegrained_fp8 import FP8GroupedLinear as HFFP8GroupedLinear  # noqa: E402
from transformers.integrations.finegrained_fp8 import FP8Linear as HFFP8Linear  # noqa: E402

import mps_ext  # noqa: E402
from mps_ext import fp8  # noqa: E402
from mps_ext.nn import FP8Linear  # noqa: E402
from conftest import on, ran  # noqa: E402
from tolerances import assert_close_dot  # noqa: E402


def hf_fp8_linear(n: int, k: int, block, bias: bool, seed: int):
    """transformers' FP8Linear holding a quantized random weight, as its loader fills it from a checkpoint."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.02
    layer = HFFP8Linear(k, n, block_size=block, has_bias=bias)
    q, s = block_quantize(w, block or (n, k))
    with torch.no_grad():
        layer.weight = torch.nn.Parameter(q, requires_grad=False)
        layer.weight_scale_inv = torch.nn.Parameter(s if block else s.reshape(()), requires_grad=False)
        if bias:
            layer.bias.copy_(torch.randn(n, generator=torch.Generator().manual_seed(seed + 1)))
    return layer, q.float() * expand(s, (n, k), block or (n, k))


# ------------------------------------------------------------------- convert

@pytest.mark.parametrize("block", [BLOCK, None])
def test_convert_adopts_transformers_fp8_linear(block, device):
    layer, deq = hf_fp8_linear(300, 260, block, bias=block is not None, seed=1)
    weight, scale, bias = layer.weight, layer.weight_scale_inv, layer.bias
    model = torch.nn.Sequential(layer, torch.nn.GELU())
    fp8.convert(model)
    got = model[0]
    assert isinstance(got, FP8Linear) and got.block_size == block
    # The same bytes and scales, shared, not requantized.
    assert got.weight.data_ptr() == weight.data_ptr() and got.weight_scale_inv.data_ptr() == scale.data_ptr()
    assert torch.equal(got.weight, weight.view(torch.uint8)) and torch.equal(got.weight_scale_inv.view(-1),
                                                                             scale.view(-1))
    x = torch.randn(2, 260, generator=torch.Generator().manual_seed(2)).bfloat16()
    with mps_ext.trace() as t:
        y = on(device, got.to(device), x)
    ran(t, device, "fp8_linear_gemv_m2_bfloat")
    want = F.linear(x.float(), deq, None if bias is None else bias.float()).bfloat16()
    assert_close_dot(y, want, x.float().abs() @ deq.abs().t(), 260)


def test_convert_refuses_fp8_it_cannot_adopt():
    e5m2 = torch.nn.Linear(16, 8)
    e5m2.weight = torch.nn.Parameter(e5m2.weight.detach().to(torch.float8_e5m2), requires_grad=False)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), e5m2)
    with pytest.raises(NotImplementedError, match=r"^convert: 1 \(Linear\) holds float8 tensors"):
        fp8.convert(model)
    assert type(model[0]) is torch.nn.Linear  # nothing replaced before the error
    fp8.convert(model, exclude=["1"])
    assert model[1] is e5m2
    bad, _ = hf_fp8_linear(300, 140, BLOCK, bias=False, seed=3)
    bad.weight_scale_inv = torch.nn.Parameter(bad.weight_scale_inv.t().contiguous(), requires_grad=False)
    with pytest.raises(ValueError, match=r"convert: 0.weight_scale_inv has shape \(2, 3\), expected \(3, 2\)"):
        fp8.convert(torch.nn.Sequential(bad))
    # transformers' FP8 layer for block-diagonal linear layers (DeepSeek-V4's): an FP8Linear would run one product.
    grouped = torch.nn.Sequential(HFFP8GroupedLinear(64, 128, n_groups=2, block_size=BLOCK))
    with pytest.raises(NotImplementedError, match=r"0 \(FP8GroupedLinear\) holds FP8 weights but runs a forward of"):
        fp8.convert(grouped)


def tiny_config(arch: str, tie: bool):
    common = dict(vocab_size=300, hidden_size=160, intermediate_size=200, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=40, max_position_embeddings=64,
                  tie_word_embeddings=tie)
    return transformers.LlamaConfig(**common) if arch == "llama" else transformers.Qwen3Config(**common)


def test_convert_excludes_and_keeps_tied_weights():
    torch.manual_seed(4)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config("llama", tie=True))
    names = {n for n, m in model.named_modules() if type(m) is torch.nn.Linear}
    with pytest.warns(UserWarning, match="lm_head stays torch.float32: its weight is tied to model.embed_tokens"):
        fp8.convert(model, exclude=["*.mlp.down_proj"])
    kept = {n for n, m in model.named_modules() if type(m) is torch.nn.Linear}
    assert kept == {"lm_head", "model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}
    assert {n for n, m in model.named_modules() if isinstance(m, FP8Linear)} == names - kept
    assert model.lm_head.weight is model.model.embed_tokens.weight

    model = transformers.AutoModelForCausalLM.from_config(tiny_config("qwen3", tie=False))
    fp8.convert(model)  # by default lm_head and the embeddings stay
    assert type(model.lm_head) is torch.nn.Linear and type(model.model.embed_tokens) is torch.nn.Embedding
    assert isinstance(model.model.layers[1].self_attn.o_proj, FP8Linear)


def test_convert_leaves_multihead_attention_working():
    torch.manual_seed(5)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    x = torch.randn(2, 5, 32)
    want = mha(x, x, x)[0]
    with pytest.warns(UserWarning, match="out_proj stays torch.float32: its parent reads its weight directly"):
        fp8.convert(mha)
    assert type(mha.out_proj) is torch.nn.modules.linear.NonDynamicallyQuantizableLinear
    assert torch.equal(mha(x, x, x)[0], want)


# ------------------------------------------------------------ from_pretrained

@pytest.mark.parametrize("arch, tie, shards", [("llama", False, 1), ("qwen3", True, 2)])
def test_from_pretrained_keeps_the_checkpoints_bytes_and_decodes_its_tokens(tmp_path, arch, tie, shards):
    torch.manual_seed(6)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(arch, tie))
    not_converted = ["lm_head", "model.layers.1.mlp.down_proj"]
    tensors, dequantized = write_fp8_checkpoint(model, tmp_path, not_converted, shards)

    loaded = fp8.from_pretrained(tmp_path, dtype=torch.float32)
    fp8_layers = {n: m for n, m in loaded.named_modules() if isinstance(m, FP8Linear)}
    assert len(fp8_layers) == 2 * 7 - 1
    for name, layer in fp8_layers.items():
        assert torch.equal(layer.weight, tensors[f"{name}.weight"].view(torch.uint8)), name
        assert torch.equal(layer.weight_scale_inv, tensors[f"{name}.weight_scale_inv"]), name
        assert layer.block_size == BLOCK
    assert fp8_layers["model.layers.0.mlp.gate_proj"].weight_scale_inv.shape == (2, 2)  # 200 rows: 128 + 72
    for name in not_converted:
        assert type(loaded.get_submodule(name)) is torch.nn.Linear
        assert torch.equal(loaded.get_submodule(name).weight, dequantized[f"{name}.weight"])
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == tie

    model.load_state_dict(dequantized)  # the reference: the same weights as floats, run by torch
    prompt = torch.tensor([[3, 141, 59, 26, 5]])
    want = model.generate(prompt, max_new_tokens=4, do_sample=False)
    with mps_ext.trace() as t:
        got = loaded.generate(prompt, max_new_tokens=4, do_sample=False)
    assert torch.equal(got, want)
    assert {"fp8_linear_gemv_m8_float", "fp8_linear_gemv_stream_float"} <= set(t.names)


def test_from_pretrained_errors(tmp_path):
    model = transformers.AutoModelForCausalLM.from_config(tiny_config("llama", tie=False))
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="is not a fine-grained FP8 checkpoint"):
        fp8.from_pretrained(tmp_path)
    tensors, _ = write_fp8_checkpoint(model, tmp_path, ["lm_head"])
    del tensors["model.layers.0.mlp.up_proj.weight_scale_inv"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(NotImplementedError, match=r"mlp.up_proj.weight \(torch.float8_e4m3fn\) is not the weight"):
        fp8.from_pretrained(tmp_path)


@pytest.mark.parametrize("tensor, broken, error", [
    ("model.layers.0.mlp.gate_proj.weight_scale_inv", lambda t: t.t().contiguous(),
     r"model\.layers\.0\.mlp\.gate_proj\.weight_scale_inv has shape \(2, 3\), expected \(3, 2\) for a weight of "
     r"shape \(300, 160\)"),
    ("model.layers.1.mlp.up_proj.weight", lambda t: t.t().contiguous(),
     r"model\.layers\.1\.mlp\.up_proj\.weight has shape \(160, 300\), expected \(300, 160\) for "
     r"model\.layers\.1\.mlp\.up_proj \(Linear\(160, 300\)\)"),
    ("model.layers.0.self_attn.o_proj.weight_scale_inv", lambda t: t.to(torch.uint8),
     r"model\.layers\.0\.self_attn\.o_proj\.weight_scale_inv is torch\.uint8, expected float32"),
], ids=["transposed scale grid", "transposed weight", "scales in bytes"])
def test_from_pretrained_checks_fp8_tensors_against_their_layer(tmp_path, tensor, broken, error):
    """FP8 tensors that do not fit their layer are refused, naming the tensor: loaded, a transposed grid would
    scale each block by another block's scale."""
    config = tiny_config("llama", tie=False)
    config.intermediate_size = 300  # gate_proj and up_proj 300 x 160: 3 x 2 blocks, not a square grid
    tensors, _ = write_fp8_checkpoint(transformers.AutoModelForCausalLM.from_config(config), tmp_path, ["lm_head"])
    tensors[tensor] = broken(tensors[tensor])
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=error):
        fp8.from_pretrained(tmp_path, dtype=torch.float32)


def test_convert_leaves_linear_subclasses_with_a_forward_of_their_own_unless_included():
    """Falcon's linear layers are FalconLinear, whose forward (x @ W.T + b) is a linear layer's product: they stay
    by default (their class overrides nn.Linear.forward, as routers' do), include= converts them."""
    torch.manual_seed(9)
    config = transformers.FalconConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with pytest.warns(UserWarning, match=r"stays torch\.float32: its class FalconLinear overrides "
                                         r"nn\.Linear\.forward") as caught:
        kept = fp8.convert(copy.deepcopy(model))
    assert len(caught) == 8 and not any(isinstance(m, FP8Linear) for m in kept.modules())
    with pytest.raises(ValueError, match=r"include=\['\*\.router'\] names no module of FalconForCausalLM"):
        fp8.convert(model, include=["*.router"])
    converted = fp8.convert(copy.deepcopy(model), include=["*.self_attention.*", "*.mlp.*"])
    assert not any(type(m).__name__ == "FalconLinear" for m in converted.transformer.h.modules())
    reference = dequantized_twin(model, converted)
    with mps_ext.trace() as t:
        got = converted.generate(PROMPT, max_new_tokens=3, do_sample=False)
    assert torch.equal(got, reference.generate(PROMPT, max_new_tokens=3, do_sample=False))
    assert "fp8_linear_gemv_stream_float" in t.names
