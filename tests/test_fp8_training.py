"""Training through FP8 weights (frozen) with transformers' own models (tiny, built from configs, random weights):
input gradients through FP8Linear layers and FP8Experts equal those of the dequantized twin run by torch, and a
LoRA-style adapter on an FP8 base trains, its gradients on the adapter only."""

import copy

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers", reason='needs transformers: pip install "mps_ext[demo]"')

from hf_fp8 import PROMPT, dequantized_twin, tiny_moe  # noqa: E402

import mps_ext  # noqa: E402
from mps_ext import fp8  # noqa: E402
from mps_ext.nn import FP8Linear  # noqa: E402
from tolerances import assert_close_normwise  # noqa: E402


def next_token_loss(model, embeds):
    logits = model(inputs_embeds=embeds).logits
    return F.cross_entropy(logits[0, :-1], PROMPT[0, 1:])


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_input_gradients_through_fp8_layers_and_experts_equal_the_dequantized_models(arch):
    model = tiny_moe(arch)
    converted = fp8.convert(copy.deepcopy(model))
    reference = dequantized_twin(model, converted)
    embeds = reference.get_input_embeddings()(PROMPT).detach()
    grads = []
    for m in (reference, converted):
        x = embeds.clone().requires_grad_()
        with mps_ext.trace() as t:
            next_token_loss(m, x).backward()
        grads.append(x.grad)
    assert {"fp8_linear_gemv_m8_float", "fp8_grouped_mm_stream8_float"} <= set(t.names)
    assert grads[1].abs().sum() > 0
    assert_close_normwise(grads[1], grads[0])


class LoRA(torch.nn.Module):
    """``base(x) + x @ A.T @ B.T * scale``, the low-rank adapter of LoRA, ``B`` zero at first."""

    def __init__(self, base: torch.nn.Module, in_features: int, out_features: int, rank: int = 4):
        super().__init__()
        self.base = base
        self.a = torch.nn.Parameter(torch.randn(rank, in_features) / rank)
        self.b = torch.nn.Parameter(torch.zeros(out_features, rank))

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(x, self.a), self.b)


def test_lora_adapter_on_an_fp8_base_trains():
    model = fp8.convert(tiny_moe("qwen3_moe"))
    model.requires_grad_(False)
    for layer in model.model.layers:
        attn = layer.self_attn
        for name in ("q_proj", "v_proj"):
            base = getattr(attn, name)
            assert isinstance(base, FP8Linear)
            setattr(attn, name, LoRA(base, base.in_features, base.out_features))
    adapters = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert len(adapters) == 2 * 2 * 2
    frozen = {n: b.clone() for n, b in model.named_buffers() if b.dtype == torch.uint8}
    optimizer = torch.optim.SGD(adapters.values(), lr=0.5)
    embeds = model.get_input_embeddings()(PROMPT)
    losses = []
    for _ in range(2):
        loss = next_token_loss(model, embeds)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[1] < losses[0]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in adapters.items() if n.endswith(".b"))
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
    assert all(torch.equal(b, frozen[n]) for n, b in model.named_buffers() if n in frozen)
