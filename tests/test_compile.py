"""torch.compile and torch.export with the overrides on: inductor's graphs call the kernels for every
overridden op but the CPU's attention (the graph holds torch's decomposition), with eager mode's decisions;
compiled artifacts follow the override state; transformers decode steps compiled with fullgraph=True give eager's
tokens. An inductor compile takes tens of seconds on two busy cores: shapes are tiny, and each test compiles once
per override state."""

import contextlib
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import mps_ext
from mps_ext.demo import kernel_family
from tolerances import TOLERANCES, assert_close_normwise

F8 = torch.float8_e4m3fn
# transformers configurations written in code: one layer, tiny sizes (random weights, nothing downloaded).
DECODERS = {
    "qwen3": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  intermediate_size=64, vocab_size=96, tie_word_embeddings=False),
    "qwen3_moe": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                      vocab_size=96, decoder_sparse_step=1, norm_topk_prob=True, tie_word_embeddings=False),
}
PROMPT, NEW_TOKENS = 5, 4


@pytest.fixture(autouse=True)
def fresh_compiles(tmp_path, monkeypatch):
    """Each test compiles into caches of its own (on disk too) and leaves no compiled frames behind."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def families(names):
    return {kernel_family(n) for n in names}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def every_op_inputs():
    g = gen(0)
    A = torch.randn(2, 4, 4, generator=g) + 4 * torch.eye(4)
    return dict(
        x=torch.randn(1, 40, generator=g), x16=torch.randn(16, 40, generator=g), w=torch.randn(24, 40, generator=g),
        w_kn=torch.randn(40, 24, generator=g),
        b=torch.randn(24, generator=g), a=torch.randn(5, 40, generator=g).bfloat16(),
        experts=torch.randn(3, 24, 40, generator=g).bfloat16(), offs=torch.tensor([2, 2, 5], dtype=torch.int32),
        x8=(torch.randn(2, 32, generator=g) * 3).to(F8), w8=(torch.randn(16, 32, generator=g) * 3).to(F8),
        A=A, B=torch.randn(2, 4, 3, generator=g))


def every_op(x, x16, w, w_kn, b, a, experts, offs, x8, w8, A, B):
    """One call of each overridden op, and two that the kernels leave to torch (16 rows, float64)."""
    y = F.linear(x, w, b)
    LU, pivots = torch.linalg.lu_factor(A)
    return (y, x @ w.T, w @ x[0], torch.addmv(b, w, x[0]), torch.addmm(b, x, w_kn), torch.softmax(y, -1),
            torch.log_softmax(y, -1),
            F.linear(x16, w), torch.softmax(y.double(), -1),
            torch._grouped_mm(a, experts.transpose(-2, -1), offs=offs),
            torch._scaled_mm(x8, w8.t(), torch.tensor(0.5), torch.tensor(2.0), out_dtype=torch.float32),
            torch.linalg.solve(A, B), torch.linalg.lu_solve(LU, pivots, B),
            torch.linalg.solve_triangular(A, B, upper=True))


def run(fn, inputs):
    """fn's outputs, the kernels it ran and the reasons of its fallbacks, with the cpu overrides on."""
    mps_ext.overrides.reset_stats()
    with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
        out = fn(**inputs)
    reasons = Counter()
    for s in mps_ext.overrides.stats().values():
        reasons.update(s["reasons"])
    return out, Counter(t.names), reasons


@pytest.mark.fallback("rows > 8|dtype Double")
def test_inductor_calls_the_kernels_of_every_overridden_op_as_eager_does():
    inputs = every_op_inputs()
    with torch.no_grad():
        want = every_op(**inputs)  # torch's own kernels
        eager, eager_kernels, eager_reasons = run(every_op, inputs)
        compiled = torch.compile(every_op, fullgraph=True)
        got, kernels, reasons = run(compiled, inputs)
    assert families(kernels) == {"gemv", "softmax", "log_softmax", "grouped_mm", "scaled", "lu", "trsm"}, kernels
    assert kernels == eager_kernels and reasons == eager_reasons == {"rows > 8": 1, "dtype Double": 1}
    for g, e, w in zip(got, eager, want):
        assert torch.equal(g, e)  # the same kernels (or torch's ops) on the same inputs
        if g.dtype in TOLERANCES:
            assert_close_normwise(g, w)
        else:
            torch.testing.assert_close(g, w)  # float64: torch's in all three


def test_a_compiled_training_step_follows_the_override_state():
    # Compiled with the cpu overrides on, the backward calls linear_backward, which only they give a cpu
    # kernel: after disable() that artifact must not run, nor be found in the caches by the next compile.
    g = gen(1)
    model = torch.nn.Sequential(torch.nn.Linear(40, 32), torch.nn.ReLU(), torch.nn.Linear(32, 24))
    x, target = torch.randn(2, 40, generator=g), torch.tensor([3, 17])

    def step(module):
        model.zero_grad()
        loss = F.nll_loss(torch.log_softmax(module(x), -1), target)
        loss.backward()
        return [loss.detach()] + [p.grad for p in model.parameters()]

    want = step(model)
    compiled = torch.compile(model)
    cache = torch._dynamo.utils.counters["aot_autograd"]
    lookups = []
    for on in (True, False, True):
        misses = cache["autograd_cache_miss"]
        with mps_ext.overrides.enabled("cpu") if on else contextlib.nullcontext(), mps_ext.trace() as t:
            got = step(compiled)
        lookups.append("miss" if cache["autograd_cache_miss"] > misses else "hit")
        for g, w in zip(got, want):
            assert_close_normwise(g, w)
        assert families(t.names) == ({"gemv", "log_softmax"} if on else set()), t.names
    # Each state compiles once (its own AOT autograd cache key); the third step finds the first's artifact.
    assert lookups == ["miss", "miss", "hit"]


def test_export_keeps_the_ops():
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(40, 24)
            self.experts = torch.nn.Parameter(torch.randn(3, 24, 24, generator=gen(2)))

        def forward(self, x, offs):
            h = torch.softmax(self.proj(x), -1)
            return mps_ext.log_softmax(mps_ext.grouped_mm(h, self.experts.transpose(-2, -1), offs), -1)

    layer = Layer()
    args = (torch.randn(5, 40, generator=gen(4)), torch.tensor([2, 2, 5], dtype=torch.int32))
    with torch.no_grad():
        want = layer(*args)
        program = torch.export.export(layer, args)
        targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
        assert {"aten.linear.default", "aten.softmax.int", "mps_ext.grouped_mm.default",
                "mps_ext.log_softmax.default"} <= targets, targets
        for module in (program.module(), program.run_decompositions().module()):
            with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
                got = module(*args)
            assert families(t.names) == {"gemv", "grouped_mm", "log_softmax", "softmax"}, t.names
            assert_close_normwise(got, want)


def decode_step(model, ids, cache, position):
    """One greedy step of a transformers decoder through its probabilities: the next token's id."""
    logits = model(input_ids=ids, position_ids=position[None], cache=cache, use_cache=True).logits[:, -1]
    return torch.softmax(logits, -1).argmax(-1, keepdim=True)


def decode(model, step):
    """NEW_TOKENS greedy tokens after an eager prefill, each decode step through ``step``; the kernels
    those steps ran."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=PROMPT + NEW_TOKENS)
    prompt = torch.randint(0, model.config.vocab_size, (1, PROMPT), generator=gen(3))
    kernels = Counter()
    with torch.no_grad():
        tokens = [decode_step(model, prompt, cache, torch.arange(PROMPT))]
        for position in range(PROMPT, PROMPT + NEW_TOKENS - 1):
            with mps_ext.trace() as t:
                tokens.append(step(model, tokens[-1], cache, torch.tensor([position])))
            kernels.update(t.names)
    return torch.cat(tokens, 1), kernels


# Tracing calls F.scaled_dot_product_attention's override at its autograd key with fake tensors (a tensor
# subclass), which it leaves to torch's composite: the compiled graph holds torch's decomposition of it.
@pytest.mark.fallback(r"^autograd: tensor subclass or tracing$")
@pytest.mark.parametrize("name", DECODERS)
def test_a_compiled_decode_step_of_a_transformers_model_runs_the_kernels(name):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(name, **DECODERS[name])
    moe = "moe" in name
    if moe:
        config._experts_implementation = "grouped_mm"  # what from_pretrained picks where torch has _grouped_mm
    # torch traces _grouped_mm for bfloat16 only (its meta kernel).
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if moe else None).eval()
    want, _ = decode(model, decode_step)  # torch's kernels
    with mps_ext.overrides.enabled("cpu"):
        _, eager_kernels = decode(model, decode_step)
        got, kernels = decode(model, torch.compile(decode_step, fullgraph=True))
    assert torch.equal(got, want)
    assert families(kernels) == ({"gemv", "softmax", "grouped_mm"} if moe else {"gemv", "softmax"}), kernels
    # Eager, each step's attention (both query heads read the one KV head, one query row each: a block of 2 rows)
    # runs the decode attention kernel once, its keys in one run (no merge). Compiled, the graph calls torch's
    # _scaled_dot_product_flash_attention_for_cpu, which the CPU overrides do not replace; every other kernel is
    # eager's.
    attention = Counter({f"attention_decode_{'bfloat' if moe else 'float'}_e2_r2": NEW_TOKENS - 1})
    assert kernels + attention == eager_kernels, (kernels, eager_kernels)
