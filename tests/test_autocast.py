"""torch.autocast around mps_ext's functions: each casts as torch's autocast casts the aten operator it stands
for (mps_ext/_autocast.py), so its result has the dtype and the values of torch's under the same region, and
its kernels run on what autocast made of the inputs."""

import pytest
import torch

import mps_ext
from mps_ext import _autocast
from conftest import on, ran_kernels
from op_cases import CASES, floating
from tolerances import assert_close

# The aten operator of each mps_ext operator without an autocast rule: torch has none for them either.
NO_RULE = {"grouped_mm": "aten::_grouped_mm", "fp8_grouped_mm": "aten::_grouped_mm", "scaled_mm": "aten::_scaled_mm",
           "lu_factor_ex": "aten::linalg_lu_factor_ex", "lu_solve": "aten::linalg_lu_solve",
           "solve_ex": "aten::linalg_solve_ex", "solve_triangular": "aten::linalg_solve_triangular"}
DEVICE_TYPES = ("cpu", "mps")


def has_autocast(op: str, device_type: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op, "Autocast" + device_type.upper())


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_rules_are_torchs(device_type):
    # A rule where torch's aten operator has autocast for that device type, and only there.
    for name, (aten, policies, _) in _autocast.RULES.items():
        assert has_autocast(aten, device_type) == (device_type in policies), (name, aten)
        assert has_autocast(f"mps_ext::{name}", device_type) == (device_type in policies), name
    for name, aten in NO_RULE.items():
        assert not has_autocast(aten, device_type), aten
        assert not has_autocast(f"mps_ext::{name}", device_type), name
    assert set(_autocast.RULES) | set(NO_RULE) == {c.name.removesuffix("_complex") for c in CASES}


def region(device: str, dtype: torch.dtype, fn):
    def run(*args):
        with torch.autocast(device, dtype=dtype):
            return fn(*args)
    return run


def rule(case, device: str):
    """The policy of the case's operator on ``device`` (None: autocast leaves it alone)."""
    entry = _autocast.RULES.get(case.name.removesuffix("_complex"))
    return entry[1].get(device) if entry else None


def reference(case, device: str, dtype: torch.dtype, inputs):
    """torch's op under the same region (autocast's policies differ by device type): on the CPU for CPU
    tensors; on mps for mps tensors, with the overrides off there. An operator that autocast leaves alone
    is torch's op outside the region (the compositions that stand for the FP8 and grouped products would
    have their matmuls cast). fp8_linear stands for a linear: its input and bias in ``dtype``, its FP8 weight
    exact, one rounding (torch's composition would round the dequantized weight to ``dtype`` too)."""
    if rule(case, device) is None:
        return case.theirs(*inputs)
    if case.name == "fp8_linear":
        x, w, scale, bias = inputs
        return case.theirs(x.to(dtype).float(), w, scale, bias.to(dtype).float()).to(dtype)
    if device == "cpu":
        return region(device, dtype, case.theirs)(*inputs)
    mps_ext.overrides.disable(device)
    try:
        return on(device, region(device, dtype, case.theirs), *inputs)
    finally:
        mps_ext.overrides.enable(device)


def lowered(case, device: str, dtype: torch.dtype, inputs):
    """For an operator that autocast runs in float32 there, its real inputs in ``dtype``: what the rule
    exists for. Other operators keep their float32 inputs, which a lower-precision rule lowers."""
    if rule(case, device) != _autocast.FP32:
        return inputs
    return tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_autocast(case, dtype, device):
    inputs = lowered(case, device, dtype, case.make(0))
    with mps_ext.trace() as t:
        got = on(device, region(device, dtype, case.ours), *inputs)
    ran_kernels(t, device)
    want = reference(case, device, dtype, inputs)
    assert [g.dtype for g in floating(got)] == [w.dtype for w in floating(want)]
    case.check(got, want)


def test_autocast_under_torch_compile():
    # torch.compile traces the region, its casts included, into the graph.
    x, w, b = (torch.randn(2, 32), torch.randn(16, 32), torch.randn(16))
    compiled = torch.compile(region("cpu", torch.bfloat16, mps_ext.linear), backend="aot_eager", fullgraph=True)
    with mps_ext.trace() as t:
        got = compiled(x, w, b)
    ran_kernels(t, "cpu")
    assert got.dtype == torch.bfloat16
    assert_close(got, torch.nn.functional.linear(x.bfloat16(), w.bfloat16(), b.bfloat16()), scale=4)


def test_a_parameter_is_cast_once_per_region_as_torch_casts_it():
    # torch keeps a float32 parameter's lower-precision copy for the rest of the region (a decode loop under one
    # autocast region casts each weight once): the same casts as F.linear's, counted at the dispatcher.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Casts(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func is torch.ops.aten._to_copy.default
            return func(*args, **(kwargs or {}))

    weight = torch.nn.Parameter(torch.randn(16, 32))
    x = torch.randn(1, 32)
    counts = []
    for linear in (torch.nn.functional.linear, mps_ext.linear):
        with torch.autocast("cpu", dtype=torch.bfloat16), Casts() as casts:
            for _ in range(3):
                linear(x, weight)
        counts.append(casts.count)
    assert counts[1] == counts[0] == 4, counts  # the weight once, the input each time
