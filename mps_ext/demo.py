"""``python -m mps_ext demo``: decode a Hugging Face transformers model greedily twice, with torch's own
kernels and with mps_ext's, and report what ran, whether the tokens agree and how fast each was.

The models are transformers' own classes (``Qwen3MoeForCausalLM``, ``LlamaForCausalLM``) built from configs
written here, with random weights (nothing is downloaded), or any causal LM by local path or hub id. On an
Apple-silicon Mac the kernels run on the GPU; elsewhere the model runs on the CPU with the overrides enabled
for ``cpu``, so the very same Metal kernels run in the simulator, inside the real model code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch

from . import overrides
from ._trace import trace
from .testing import mps_usable

INSTALL = 'pip install "mps_ext[demo]"'

# Configurations written in code, by size: "tiny" is the test suite's, "small" the simulator's default (about
# a minute on two CPU cores), "real" the published model's layer shapes (the default on an Apple GPU).
QWEN3_MOE_COMMON = dict(num_key_value_heads=2, decoder_sparse_step=1, norm_topk_prob=True, tie_word_embeddings=False)
LLAMA_COMMON = dict(num_key_value_heads=2, tie_word_embeddings=False)
MODELS = {
    "qwen3-moe": ("qwen3_moe", "Qwen3-MoE", {
        "tiny": dict(QWEN3_MOE_COMMON, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, head_dim=16,
                     num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=64,
                     vocab_size=128),
        "small": dict(QWEN3_MOE_COMMON, hidden_size=256, num_hidden_layers=4, num_attention_heads=8, head_dim=32,
                      num_experts=32, num_experts_per_tok=4, moe_intermediate_size=128, intermediate_size=512,
                      vocab_size=4096),
        # Qwen3-30B-A3B's shapes (config.json), 2 of its 48 layers.
        "real": dict(hidden_size=2048, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=4,
                     head_dim=128, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                     intermediate_size=6144, vocab_size=151936, decoder_sparse_step=1, norm_topk_prob=True,
                     tie_word_embeddings=False),
    }),
    "llama": ("llama", "Llama", {
        "tiny": dict(LLAMA_COMMON, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, head_dim=16,
                     intermediate_size=128, vocab_size=128),
        "small": dict(LLAMA_COMMON, hidden_size=512, num_hidden_layers=4, num_attention_heads=8, head_dim=64,
                      intermediate_size=1408, vocab_size=4096),
        # Llama 3.2 1B's shapes (config.json), all 16 layers.
        "real": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=64, intermediate_size=8192, vocab_size=128256, rope_theta=500000.0,
                     tie_word_embeddings=True),
    }),
}

# Kernel host names begin with their family's name (metal/<family>.metal).
FAMILIES = {"gemv": "GEMV (linear)", "grouped_mm": "grouped matmul (MoE experts)", "softmax": "softmax",
            "log_softmax": "log_softmax", "fp8": "FP8 linear", "attention": "attention"}


def kernel_family(name: str) -> str:
    """The op family of a kernel host name (``gemv_dense_m1_r1_float`` -> ``gemv``)."""
    return max((f for f in FAMILIES if name.startswith(f + "_")), key=len, default=name.split("_")[0])


@dataclass
class Decode:
    """One greedy decode: the new tokens, each step's logits (float32, CPU) and the time it took."""

    tokens: list[int]
    logits: torch.Tensor
    prefill_s: float
    decode_s: float

    @property
    def tokens_per_s(self) -> float | None:
        """Decode speed: the tokens after the first (which the prefill makes) over their time."""
        return (len(self.tokens) - 1) / self.decode_s if len(self.tokens) > 1 and self.decode_s > 0 else None


@dataclass
class Report:
    """What the demo measured; ``as_dict()`` is what ``--json`` writes."""

    model: str
    device: str
    backend: str
    dtype: str
    fp8: bool
    prompt_tokens: int
    new_tokens: int
    torch_run: Decode
    mps_ext_run: Decode
    routing: dict  # aten op -> {"hits", "fallbacks", "reasons"} (mps_ext.overrides.stats())
    kernels: Counter  # kernel host name -> dispatches (mps_ext.trace())
    families: dict = field(default_factory=dict)  # family -> dispatches
    backends: set = field(default_factory=set)  # where the traced kernels ran ("simulator", "metal")

    @property
    def same_tokens(self) -> int:
        """How many new tokens agree before the first difference."""
        n = 0
        for a, b in zip(self.torch_run.tokens, self.mps_ext_run.tokens):
            if a != b:
                break
            n += 1
        return n

    @property
    def max_logit_diff(self) -> float:
        """Largest logit difference over the steps that saw the same tokens (after a difference the contexts
        differ and the logits are not comparable)."""
        steps = min(self.same_tokens + 1, len(self.torch_run.tokens))
        a, b = self.torch_run.logits[:steps], self.mps_ext_run.logits[:steps]
        return float((a - b).abs().max()) if steps else 0.0

    def as_dict(self) -> dict:
        def run(d: Decode) -> dict:
            return {"tokens": d.tokens, "prefill_s": d.prefill_s, "decode_s": d.decode_s,
                    "tokens_per_s": d.tokens_per_s}

        return {"model": self.model, "device": self.device, "backend": self.backend, "dtype": self.dtype,
                "fp8": self.fp8, "prompt_tokens": self.prompt_tokens, "new_tokens": self.new_tokens,
                "torch": run(self.torch_run), "mps_ext": run(self.mps_ext_run), "routing": self.routing,
                "kernels": dict(self.kernels), "families": self.families,
                "tokens_identical": self.same_tokens == len(self.torch_run.tokens), "same_tokens": self.same_tokens,
                "max_logit_diff": self.max_logit_diff, "max_abs_logit": float(self.torch_run.logits.abs().max())}


def _sync(device: str) -> None:
    if device == "mps":
        torch.mps.synchronize()


@contextlib.contextmanager
def _overrides(device: str, on: bool):
    """The overrides on ``device`` switched on or off inside the block, restored afterwards."""
    was = overrides.is_enabled(device)
    (overrides.enable if on else overrides.disable)(device)
    try:
        yield
    finally:
        (overrides.enable if was else overrides.disable)(device)


def _torch_dequantized(weight: torch.Tensor, scale: torch.Tensor, block_size) -> torch.Tensor:
    """An FP8 weight in float32 by torch's own float8 conversion times its scale (per block, row or tensor),
    on the CPU (torch before 2.15 cannot convert float8 on mps): the reference owes nothing to mps_ext's codec."""
    w = (weight.view(torch.float8_e4m3fn) if weight.dtype == torch.uint8 else weight).cpu().float()
    s = scale.cpu().float()
    if block_size is not None:
        rows, cols = block_size
        s = s.repeat_interleave(rows, 0).repeat_interleave(cols, 1)[: w.shape[0], : w.shape[1]]
    elif s.numel() > 1:
        s = s.reshape(-1, 1)
    return w * s.reshape(s.shape if s.dim() == 2 else ())


@contextlib.contextmanager
def _fp8_dequantized(model: torch.nn.Module, dtype: torch.dtype):
    """torch's way to run an FP8 model without mps_ext: every FP8Linear replaced by an nn.Linear holding its
    weight dequantized to ``dtype`` (the same values the FP8 kernels compute with) inside the block."""
    from .nn import FP8Linear

    swapped = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, FP8Linear):
                linear = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                         device=child.weight.device, dtype=dtype)
                with torch.no_grad():
                    linear.weight.copy_(_torch_dequantized(child.weight, child.weight_scale_inv, child.block_size))
                    if child.bias is not None:
                        linear.bias.copy_(child.bias)
                setattr(parent, name, linear)
                swapped.append((parent, name, child))
    try:
        yield
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass


def _progress(total: int, desc: str, enabled: bool):
    """A tqdm progress bar on stderr (transformers depends on tqdm), or none."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        enabled = False
    if not enabled:
        return contextlib.nullcontext(_NoBar())
    return tqdm(total=total, desc=desc, unit="tok", leave=True, dynamic_ncols=True, file=sys.stderr)


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' warnings and log messages about generation settings silenced inside the block."""
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module="transformers")
            yield
    finally:
        logging.set_verbosity(verbosity)


def decode(model, input_ids: torch.Tensor, new_tokens: int, desc: str = "", progress: bool = True) -> Decode:
    """Greedy ``model.generate`` of exactly ``new_tokens`` tokens (end-of-sequence tokens do not stop it),
    timed per token through a streamer, with a progress bar."""
    from transformers.generation.streamers import BaseStreamer

    device = input_ids.device.type
    stamps: list[float] = []

    with _progress(new_tokens, desc, progress) as bar:
        class Clock(BaseStreamer):
            prompt_seen = False

            def put(self, value):
                if not self.prompt_seen:  # generate() hands the prompt over first
                    self.prompt_seen = True
                    return
                _sync(device)
                stamps.append(time.perf_counter())
                bar.update(1)

            def end(self):
                pass

        _sync(device)
        start = time.perf_counter()
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, streamer=Clock(),
                             output_logits=True, return_dict_in_generate=True,
                             pad_token_id=model.generation_config.pad_token_id or 0,
                             temperature=None, top_p=None, top_k=None)
    tokens = out.sequences[0, input_ids.shape[1]:].tolist()
    logits = torch.stack([step[0].float().cpu() for step in out.logits])
    return Decode(tokens, logits, prefill_s=stamps[0] - start, decode_s=stamps[-1] - stamps[0])


def build_model(name: str, size: str, dtype: torch.dtype, device: str, layers: int | None = None):
    """A transformers model and a description of it: one of MODELS with random weights, or a checkpoint
    (local path or hub id). Returns (model, tokenizer or None, description)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if name in MODELS:
        model_type, label, sizes = MODELS[name]
        kwargs = dict(sizes[size])
        if layers:
            kwargs["num_hidden_layers"] = layers
        config = AutoConfig.for_model(model_type, **kwargs)
        with torch.device(device):  # random weights made where they will run
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        experts = (f", {config.num_experts} experts (top {config.num_experts_per_tok})"
                   if hasattr(config, "num_experts") else "")
        desc = (f"{label} ({type(model).__name__}, random weights, {size} size): {config.num_hidden_layers} layers, "
                f"hidden {config.hidden_size}{experts}, vocab {config.vocab_size}")
        return model.eval(), None, desc
    from transformers import AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(name)
    return model, tokenizer, f"{name} ({type(model).__name__})"


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def run(model: str = "qwen3-moe", tokens: int = 32, prompt_tokens: int = 12, prompt: str | None = None,
        dtype: str = "bfloat16", device: str = "auto", size: str | None = None, layers: int | None = None,
        fp8: bool = False, seed: int = 0, progress: bool = True, out=print) -> Report:
    """The demo as a function: builds the model, decodes with the overrides off then on, prints the report
    through ``out`` and returns it."""
    if tokens < 1:
        raise ValueError(f"tokens must be at least 1, got {tokens}")
    with _quiet_transformers():
        return _run(model, tokens, prompt_tokens, prompt, dtype, device, size, layers, fp8, seed, progress, out)


def _run(model, tokens, prompt_tokens, prompt, dtype, device, size, layers, fp8, seed, progress, out) -> Report:
    import transformers

    from . import fp8 as fp8_module

    usable, why = mps_usable()
    if device == "auto":
        device = "mps" if usable else "cpu"
    if device == "mps" and not usable:
        raise SystemExit(f"--device mps: {why}")
    backend = "metal" if device == "mps" else "simulator"
    size = size or ("real" if device == "mps" else "small")
    torch_dtype = DTYPES[dtype]

    torch.manual_seed(seed)
    net, tokenizer, desc = build_model(model, size, torch_dtype, device, layers)
    if fp8:  # linear layers only: the torch run swaps FP8Linear layers back to nn.Linear (_fp8_dequantized)
        fp8_module.convert(net, exclude=[*fp8_module.DEFAULT_EXCLUDE, "experts"])
    if tokenizer is not None:
        input_ids = tokenizer(prompt or "The capital of France is", return_tensors="pt").input_ids.to(device)
    else:
        generator = torch.Generator().manual_seed(seed)
        input_ids = torch.randint(0, net.config.vocab_size, (1, prompt_tokens), generator=generator).to(device)

    out(f"mps_ext demo: {desc}, {dtype}{', linear layers in FP8 (mps_ext.fp8.convert)' if fp8 else ''}")
    if backend == "metal":
        from . import _C

        out(f"device: mps ({dict(_C._metal_device_info()).get('name', 'Apple GPU')}): mps_ext's kernels run on the GPU")
    else:
        out("device: cpu; mps_ext's Metal kernels run in the simulator (overrides enabled for cpu)"
            + (f"; no Apple GPU here: {why}" if not usable else ""))
    out(f"torch {torch.__version__}, transformers {transformers.__version__}; greedy decode of {tokens} tokens after a "
        f"{input_ids.shape[1]}-token prompt, with torch's kernels, then with mps_ext's")

    def reference():  # how torch alone runs the model
        return _fp8_dequantized(net, torch_dtype) if fp8 else contextlib.nullcontext()

    with torch.no_grad():
        # Not timed: first calls compile kernels and build pipelines (mps) and initialize torch's CPU kernels.
        with _overrides(device, True):
            decode(net, input_ids, 2, progress=False)
        with reference(), _overrides(device, False):
            decode(net, input_ids, 2, progress=False)
        with reference(), _overrides(device, False):
            theirs = decode(net, input_ids, tokens, f"{'torch':<10}", progress)
        overrides.reset_stats()
        with _overrides(device, True), trace(max_records=1_000_000) as t:
            ours = decode(net, input_ids, tokens, f"{'mps_ext':<10}", progress)
        routing = overrides.stats()
    kernels = Counter(t.names)
    families = Counter()
    for name, count in kernels.items():
        families[kernel_family(name)] += count
    report = Report(desc, device, backend, dtype, fp8, input_ids.shape[1], tokens, theirs, ours, routing, kernels,
                    dict(families), {k.backend for k in t.kernels})
    print_report(report, tokenizer, out)
    return report


def print_report(r: Report, tokenizer=None, out=print) -> None:
    """The routing, the kernels, the comparison and the speeds, as text."""
    out("\nroute of each overridden aten op the model called (mps_ext run):")
    out(f"  {'aten op':<22} {'mps_ext kernels':>15} {'torch':>7}  why torch")
    for op, s in sorted(r.routing.items()):
        if s["hits"] or s["fallbacks"]:
            reasons = ", ".join(f"{why} ({n})" for why, n in sorted(s["reasons"].items()))
            out(f"  {op:<22} {s['hits']:>15} {s['fallbacks']:>7}  {reasons}".rstrip())
    if r.fp8:
        out("  FP8Linear layers call mps_ext.fp8_linear itself (no override needed): its kernels are listed below")
    out("  (ops without an mps_ext kernel, e.g. norms, activations, run torch's own)")
    out(f"\nkernels dispatched ({r.backend}):")
    out(f"  {'family':<30} {'kernel':<34} {'dispatches':>10}")
    for name, count in sorted(r.kernels.items(), key=lambda kv: (kernel_family(kv[0]), kv[0])):
        out(f"  {FAMILIES.get(kernel_family(name), kernel_family(name)):<30} {name:<34} {count:>10}")
    if not r.kernels:
        out("  none")
    d = r.as_dict()
    out("\nresult:")
    same = "yes" if d["tokens_identical"] else f"no: the first {r.same_tokens} of {r.new_tokens} agree"
    out(f"  tokens identical:  {same}")
    out(f"  max |logit diff|:  {d['max_logit_diff']:.3g} (largest |logit| {d['max_abs_logit']:.3g})")
    if tokenizer is not None:
        out(f"  torch text:        {tokenizer.decode(r.torch_run.tokens)!r}")
        out(f"  mps_ext text:      {tokenizer.decode(r.mps_ext_run.tokens)!r}")
    elif d["tokens_identical"]:
        out(f"  tokens:            {_short(r.torch_run.tokens)}")
    else:
        out(f"  tokens (torch):    {_short(r.torch_run.tokens)}")
        out(f"  tokens (mps_ext):  {_short(r.mps_ext_run.tokens)}")
    where = {"metal": "mps (GPU)", "simulator": "cpu"}[r.backend]
    theirs = "torch's kernels" + (f", FP8 weights dequantized to {r.dtype} (nn.Linear)" if r.fp8 else "")
    for label, run_, how in (("torch", r.torch_run, theirs),
                             ("mps_ext", r.mps_ext_run, "Metal kernels on the GPU" if r.backend == "metal"
                              else "Metal kernels in the simulator")):
        tps = f"{run_.tokens_per_s:.2f} tokens/s" if run_.tokens_per_s else "n/a"
        out(f"  {label + ':':<18} {tps} on {where} ({how}; prefill {run_.prefill_s * 1e3:.0f} ms)")
    if r.backend == "simulator":
        out("  note: the mps_ext timings are CPU-simulation timings of the Metal kernels (the simulator is a testing\n"
            "        tool), not GPU speed; on an Apple-silicon Mac this demo runs them on the GPU, and\n"
            "        python -m mps_ext bench times each kernel against torch's")


def _short(tokens: list[int], n: int = 16) -> str:
    return " ".join(map(str, tokens[:n])) + (f" ... ({len(tokens)} tokens)" if len(tokens) > n else "")


def _at_least_one(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="qwen3-moe",
                        help="qwen3-moe (default), llama (random weights, built in code), or a local path or hub "
                             "id of a causal LM")
    parser.add_argument("--tokens", type=_at_least_one, default=32, help="tokens to decode (default 32)")
    parser.add_argument("--prompt-tokens", type=_at_least_one, default=12,
                        help="random prompt length for the built-in models (default 12)")
    parser.add_argument("--prompt", help="prompt text for a checkpoint")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    parser.add_argument("--device", choices=["auto", "mps", "cpu"], default="auto",
                        help="auto (default): mps when an Apple GPU is usable, else cpu (the simulator)")
    parser.add_argument("--size", choices=["tiny", "small", "real"],
                        help="built-in model size: real (default on mps: published layer shapes), small (default "
                             "on cpu), tiny")
    parser.add_argument("--layers", type=_at_least_one, help="number of layers of a built-in model")
    parser.add_argument("--fp8", action="store_true", help="convert the linear layers to FP8 (mps_ext.fp8.convert)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    """``python -m mps_ext demo``."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        print(f"The demo runs a Hugging Face transformers model, and transformers is not installed.\n"
              f"Install it with:  {INSTALL}   (from a checkout: pip install --no-build-isolation -e \".[demo]\", "
              f"or ./run demo)", file=sys.stderr)
        return 2
    report = run(model=args.model, tokens=args.tokens, prompt_tokens=args.prompt_tokens, prompt=args.prompt,
                 dtype=args.dtype, device=args.device, size=args.size, layers=args.layers, fp8=args.fp8,
                 seed=args.seed, progress=not args.no_progress)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.as_dict(), f, indent=2)
    return 0
