"""Every op on inputs carrying torch's lazy conjugate and negative bits, called
directly and through the aten overrides, on each device: the kernels run on
the resolved values and match torch on plain inputs."""

import pytest
import torch

import mps_ext
from conftest import on, ran_kernels
from op_cases import CASES

# Each gives a tensor equal to x that carries lazy bits.
LAZY = {
    "neg": lambda x: torch._neg_view(-x),
    "conj_imag": lambda x: torch.complex(torch.zeros_like(x), -x).conj().imag,  # a negative bit, as views make it
    "conj": lambda x: x.conj_physical().conj(),
}


def flagged(x, kind):
    out = LAZY[kind](x)
    assert torch.equal(out, x) and (out.is_neg() or out.is_conj())
    return out


def lazy_inputs():
    """(case, input index, kind) for every floating input of every case and each kind of bit it can carry."""
    for case in CASES:
        for i, x in enumerate(case.make(0)):
            if x.is_complex():
                kinds = ["neg", "conj"]
            elif x.is_floating_point() and x.element_size() > 1:
                kinds = ["neg", "conj_imag"]
            else:
                continue
            for kind in kinds:
                yield pytest.param(case, i, kind, id=f"{case.name}-input{i}-{kind}")


@pytest.mark.parametrize("route", ["mps_ext", "overrides"])
@pytest.mark.parametrize("case, index, kind", list(lazy_inputs()))
def test_lazy_bits_are_resolved(case, index, kind, route, device):
    if route == "overrides" and not case.overridden:
        pytest.skip(f"torch has no op that the overrides route to {case.name}")
    inputs = case.make(0)
    want = case.theirs(*inputs)
    inputs = tuple(flagged(x, kind) if i == index else x for i, x in enumerate(inputs))

    def call(*inputs):
        assert inputs[index].is_neg() or inputs[index].is_conj()  # the bit went with it to the device
        if route == "mps_ext":
            return case.ours(*inputs)
        with mps_ext.overrides.enabled(device):
            return case.theirs(*inputs)

    with mps_ext.trace() as t:
        got = on(device, call, *inputs)
    ran_kernels(t, device)
    case.check(got, want)
