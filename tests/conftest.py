import re
import signal
from pathlib import Path

import pytest
import torch

import mps_ext.sim
from mps_ext.testing import mps_usable

# tests/metal_emu runs in a process of its own (tests/test_metal_emu.py); collected here, its conftest
# would become the `conftest` module that the tests import their helpers from.
collect_ignore = ["metal_emu"]

# A suite started in the background by a non-interactive shell inherits SIGINT ignored, as would every process
# it starts: the tests of Ctrl-C need it delivered.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

KERNELS = Path(__file__).parent / "kernels"


def pytest_configure(config):
    config.addinivalue_line("markers", "fallback(reason, required=True): the test expects calls to be left to "
                                       "torch, each for a reason matching this regular expression (and, if "
                                       "required, at least one to be)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.call_passed = report.passed  # read by no_silent_fallback's teardown
    return report


@pytest.fixture(autouse=True)
def no_silent_fallback(request, monkeypatch):
    """Every call that mps_ext (an override or one of its own ops) leaves to torch instead of running a kernel
    fails the test, unless the test is marked ``@pytest.mark.fallback(reason)`` and the reason matches: a parity
    test whose call fell back would compare torch with torch. Autograd's own products ("<op> (backward)") are
    torch's derivative formulas, not parity calls, and are not checked."""
    import mps_ext

    counted: dict[tuple[str, str], int] = {}

    def collect():
        for op, s in mps_ext.overrides.stats().items():
            if not op.endswith("(backward)"):
                for reason, n in s["reasons"].items():
                    counted[op, reason] = counted.get((op, reason), 0) + n

    reset = mps_ext.overrides.reset_stats

    def reset_keeping_count():  # a test's own reset_stats() does not hide what came before it
        collect()
        reset()

    reset()
    monkeypatch.setattr(mps_ext.overrides, "reset_stats", reset_keeping_count)
    yield
    collect()
    fell_back = sorted(f"{op}: {reason} ({n}x)" for (op, reason), n in counted.items())
    marker = request.node.get_closest_marker("fallback")
    if marker is None:
        assert not fell_back, ("calls were left to torch (mark the test @pytest.mark.fallback(reason) if it "
                               f"expects that): {fell_back}")
    else:
        # A test that skipped itself (an mps copy where the call has no mps path) or failed is not held to it.
        required = marker.kwargs.get("required", True) and getattr(request.node, "call_passed", False)
        assert fell_back or not required, (
            f"marked fallback({marker.args[0]!r}), but every call ran a kernel")
        unexpected = sorted(f"{op}: {reason}" for op, reason in counted if not re.search(marker.args[0], reason))
        assert not unexpected, f"calls were left to torch for reasons other than {marker.args[0]!r}: {unexpected}"


@pytest.fixture(scope="session")
def kernels():
    """Compiles tests/kernels/<name>.metal for the simulator (cached per session)."""
    cache = {}

    def get(name: str) -> mps_ext.sim.Library:
        if name not in cache:
            cache[name] = mps_ext.sim.compile_file(KERNELS / f"{name}.metal")
        return cache[name]

    return get


@pytest.fixture(scope="session")
def shader():
    """Compiles MSL source text for the simulator."""
    return mps_ext.sim.compile_shader


@pytest.fixture(params=["cpu", "mps"])
def device(request):
    """Runs a test on CPU tensors (the simulator) and on mps tensors (the GPU) when MPS really works here."""
    if request.param == "mps":
        usable, why = mps_usable()
        if not usable:
            pytest.skip(why)
    return request.param


def backend(device: str) -> str:
    """The backend that runs the kernels of tensors on ``device``."""
    return "simulator" if device == "cpu" else "metal"


def ran(t, device: str, *names: str):
    """The trace ``t`` holds exactly the kernels ``names``, in this order, all run on ``device``'s backend (no
    call was left to torch)."""
    assert t.names == list(names) and all(k.backend == backend(device) for k in t.kernels), t.names


def ran_kernels(t, device: str):
    """The trace ``t`` holds at least one kernel, every one run on ``device``'s backend (for calls whose kernels
    depend on the case)."""
    assert t.kernels and all(k.backend == backend(device) for k in t.kernels), t.names


def to_device(device: str, x):
    """``x`` on ``device`` as it is here: its layout (strides, offset, stride-0 dimensions: ``Tensor.to`` would
    make a tensor with gaps contiguous) and its lazy conjugate and negative bits (``Tensor.to`` resolves them);
    e4m3fn tensors as the bytes torch keeps on ``device`` (uint8 where it has no float8). Anything that is not a
    tensor is returned as it is."""
    from mps_ext import fp8

    if not isinstance(x, torch.Tensor):
        return x
    x = x.view(fp8.storage_dtype(device)) if x.dtype == torch.float8_e4m3fn else x
    if x.device.type == device:
        return x
    if x.requires_grad:
        return x.to(device)  # the autograd graph goes with a copy
    if x.is_conj():  # x.conj() is the same memory without the bit
        return to_device(device, x.conj()).conj()
    if x.is_neg():
        return torch._neg_view(to_device(device, torch._neg_view(x)))
    whole = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())
    return whole.to(device).as_strided(x.shape, x.stride(), x.storage_offset())


def to_cpu(device: str, out):
    """The results ``out`` of a call on ``device`` (a tensor, or a tuple of them) on the CPU; e4m3fn results
    that travelled as uint8 come back as e4m3fn."""
    from mps_ext import fp8

    if isinstance(out, tuple):
        return tuple(to_cpu(device, x) for x in out)
    if not isinstance(out, torch.Tensor):
        return out
    x = out.cpu()
    return x.view(torch.float8_e4m3fn) if x.dtype == torch.uint8 and fp8.storage_dtype(device) == torch.uint8 else x


def on(device: str, fn, *args, **kwargs):
    """``fn`` with its tensor arguments moved to ``device`` (``to_device``) and its results back on the CPU
    (``to_cpu``), for comparing with torch's CPU results."""
    out = fn(*(to_device(device, x) for x in args), **{k: to_device(device, v) for k, v in kwargs.items()})
    return to_cpu(device, out)


def run_python(code: str, env: dict | None = None, timeout: float = 120, **popen):
    """Runs `code` in a fresh interpreter from the repository root (for what must start a new process:
    environment read once, crashes, hangs, signals); returns the CompletedProcess."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    full_env = {**os.environ, "PYTHONPATH": str(root), **(env or {})}
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=full_env, capture_output=True, text=True,
                          timeout=timeout, **popen)
