"""`python -m mps_ext demo` on the simulator: transformers' own Qwen3-MoE and Llama classes (tiny configs,
random weights) decode greedily with torch's kernels and with mps_ext's; each kernel family the model calls
must run inside the model code, and the tokens must be the same."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason='the demo needs transformers: pip install "mps_ext[demo]"')

import torch  # noqa: E402

from mps_ext import demo  # noqa: E402
from tolerances import TOLERANCES  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# Subprocesses import this checkout (and what PYTHONPATH already adds).
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

# What each model's decode calls and which of our kernel families serve it (tests/../clients.md): the router
# F.linear and the projections go to GEMV, the router's softmax to softmax, the experts' _grouped_mm to
# grouped matmul, decode attention (SDPA) to attention. With --fp8 every nn.Linear but lm_head (kept in the model's dtype, as Hugging Face's FP8
# recipes keep it) runs the FP8 kernels; lm_head and the MoE router (a bare weight) run GEMV.
FAMILIES = {("qwen3-moe", False): {"gemv", "grouped_mm", "softmax", "attention"}, ("llama", False): {"gemv", "attention"},
            ("qwen3-moe", True): {"gemv", "grouped_mm", "softmax", "fp8", "attention"},
            ("llama", True): {"gemv", "fp8", "attention"}}
OPS = {"gemv": {"aten::linear"}, "grouped_mm": {"aten::_grouped_mm"}, "softmax": {"aten::_softmax"}, "fp8": set(),
       "attention": {"aten::scaled_dot_product_attention"}}


def run_demo(model, dtype, fp8=False, tokens=8):
    lines = []
    report = demo.run(model=model, size="tiny", tokens=tokens, dtype=dtype, device="cpu", fp8=fp8, progress=False,
                      out=lines.append)
    return report, "\n".join(lines)


@pytest.mark.fallback("rows > 8|prefill")  # the prompt's prefill
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model", ["qwen3-moe", "llama"])
def test_greedy_decode_with_the_kernels_in_the_model(model, dtype):
    r, text = run_demo(model, dtype)
    assert r.backend == "simulator" and r.backends == {"simulator"}
    # The same tokens, and logits as close as the dtype's rounding allows: within one unit at the largest
    # logit (measured: float32 2e-7 of it, bfloat16 0).
    assert r.torch_run.tokens == r.mps_ext_run.tokens and len(r.mps_ext_run.tokens) == 8
    assert r.max_logit_diff <= TOLERANCES[getattr(torch, dtype)][0] * float(r.torch_run.logits.abs().max())
    # Each family the model calls ran, inside generate(), and only those.
    assert set(r.families) == FAMILIES[(model, False)]
    for family in r.families:
        for op in OPS[family]:
            assert r.routing[op]["hits"] > 0, (op, r.routing)
    # The 12-token prompt is prefill, past the GEMV kernels' 8 rows: those linear calls go to torch, counted.
    linear = r.routing["aten::linear"]
    assert set(linear["reasons"]) == {"rows > 8"} and linear["fallbacks"] == linear["reasons"]["rows > 8"] > 0
    assert "tokens identical:  yes" in text
    assert "CPU-simulation timings" in text and "not GPU" in text
    for family in r.families:
        assert demo.FAMILIES[family] in text
    assert r.torch_run.tokens_per_s > 0 and r.mps_ext_run.tokens_per_s > 0


@pytest.mark.fallback("rows > 8|prefill", required=False)  # the router's prefill (FP8 layers run kernels for any rows)
@pytest.mark.parametrize("model", ["qwen3-moe", "llama"])
def test_fp8_decode_against_torch_on_the_dequantized_weights(model):
    r, text = run_demo(model, "bfloat16", fp8=True, tokens=6)
    assert set(r.families) == FAMILIES[(model, True)]
    assert any(name.startswith("fp8_gemv") or name.startswith("fp8_") for name in r.kernels)
    assert r.torch_run.tokens == r.mps_ext_run.tokens
    # Activations round to bfloat16 in another order than torch's: within one bfloat16 unit at the largest
    # logit (measured: 0.47 and 0.61 of a unit).
    assert r.max_logit_diff <= TOLERANCES[torch.bfloat16][0] * float(r.torch_run.logits.abs().max())
    assert "linear layers in FP8" in text and "FP8 weights dequantized to bfloat16" in text


def test_cli_writes_the_report(tmp_path):
    out = tmp_path / "demo.json"
    p = subprocess.run([sys.executable, "-m", "mps_ext", "demo", "--size", "tiny", "--tokens", "4", "--device", "cpu",
                        "--no-progress", "--json", str(out)], capture_output=True, text=True, cwd=ROOT,
                       env=ENV, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Qwen3-MoE (Qwen3MoeForCausalLM, random weights, tiny size)" in p.stdout
    assert "route of each overridden aten op" in p.stdout and "aten::_grouped_mm" in p.stdout
    report = json.loads(out.read_text())
    assert report["tokens_identical"] and report["new_tokens"] == 4 and report["backend"] == "simulator"
    assert set(report["families"]) == FAMILIES[("qwen3-moe", False)]
    assert report["mps_ext"]["tokens"] == report["torch"]["tokens"]


def test_without_transformers_it_says_how_to_get_it():
    code = ("import sys; sys.modules['transformers'] = None\n"
            "from mps_ext.__main__ import main; sys.exit(main(['demo']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=ENV, timeout=120)
    assert p.returncode == 2
    assert 'pip install "mps_ext[demo]"' in p.stderr and "Traceback" not in p.stderr
