"""Autograd in both modes over every op: gradients (backward) and tangents
(torch.autograd.forward_ad, torch.func.jvp, torch.func.jacfwd) of mps_ext's
functions and of torch's ops with the cpu overrides on, against torch's with
the overrides off; and backward for every bias form of every linear path."""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import forward_ad

import mps_ext
from mps_ext import fp8
from op_cases import CASES, randn
from tolerances import assert_close

ROUTES = ["mps_ext", "overrides"]


def route_of(case, route):
    """The function to differentiate and the context to run it in."""
    if route == "mps_ext":
        return case.ours, contextlib.nullcontext()
    if not case.overridden:
        pytest.skip(f"torch has no op that the overrides route to {case.name}")
    return case.theirs, mps_ext.overrides.enabled("cpu")


def floating(outputs):
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return [o for o in outputs if o.is_floating_point() or o.is_complex()]


def kernels_ran(t):
    assert t.kernels and all(k.backend == "simulator" for k in t.kernels), t.names


def gradients(f, inputs, differentiable, seed=7):
    """d(<outputs, random cotangents>)/d(differentiable inputs)."""
    inputs = [x.detach().requires_grad_(i in differentiable) for i, x in enumerate(inputs)]
    outs = floating(f(*inputs))
    cotangents = [randn(*o.shape, dtype=o.dtype, seed=seed + j) for j, o in enumerate(outs)]
    return torch.autograd.grad(outs, [inputs[i] for i in differentiable], cotangents)


def tangents_for(case, inputs):
    return tuple(randn(*x.shape, dtype=x.dtype, seed=11 + i) if i in case.differentiable else None
                 for i, x in enumerate(inputs))


def jvp(f, inputs, tangents, mode):
    """The outputs' tangents, by ``mode``."""
    if mode == "forward_ad":
        with forward_ad.dual_level():
            duals = [x if t is None else forward_ad.make_dual(x, t) for x, t in zip(inputs, tangents)]
            outs = f(*duals)
            outs = outs if isinstance(outs, tuple) else (outs,)
            return tuple(forward_ad.unpack_dual(o).tangent for o in floating(outs))
    which = [i for i, t in enumerate(tangents) if t is not None]

    def of(*xs):
        full = list(inputs)
        for i, x in zip(which, xs):
            full[i] = x
        return tuple(floating(f(*full)))

    primals = tuple(inputs[i] for i in which)
    if mode == "jvp":
        return torch.func.jvp(of, primals, tuple(tangents[i] for i in which))[1]
    # jacfwd: the Jacobian in the input with a tangent, applied to it.
    jacobians = torch.func.jacfwd(lambda x: of(x, *primals[1:]))(primals[0])
    t = tangents[which[0]]
    return tuple((J.reshape(o.numel(), t.numel()) @ t.reshape(-1)).reshape(o.shape)
                 for J, o in zip(jacobians, of(*primals)))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_backward(case, route):
    f, context = route_of(case, route)
    inputs = case.make(0)
    if not case.backward:
        if route == "overrides":
            pytest.skip(f"torch has no derivative for {case.name} either")
        with pytest.raises(RuntimeError, match=f"mps_ext.{case.name} has no backward"):
            gradients(f, inputs, case.differentiable)
        return
    want = gradients(case.theirs, inputs, case.differentiable)
    with context, mps_ext.trace() as t:
        got = gradients(f, inputs, case.differentiable)
    kernels_ran(t)
    case.check(tuple(got), tuple(want))


@pytest.mark.parametrize("mode", ["forward_ad", "jvp", "jacfwd"])
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_forward_derivative(case, route, mode, request):
    if route == "overrides" and mode == "jacfwd":  # vmap batches the tangents: more rows than the GEMV takes
        request.applymarker(pytest.mark.fallback("rows > 8|mat2 not a transposed", required=False))
    f, context = route_of(case, route)
    inputs = case.make(0)
    if mode == "jacfwd" and any(x.is_complex() for x in inputs):
        pytest.skip("torch.func.jacfwd takes real inputs only")
    tangents = tangents_for(case, inputs)
    if mode == "jacfwd":  # the Jacobian in one input (the first differentiable)
        first = case.differentiable[0]
        tangents = tuple(t if i == first else None for i, t in enumerate(tangents))
    if route == "overrides" and case.reference_jvp:  # torch has no forward derivative: the same error with ours
        with pytest.raises(NotImplementedError, match="forward AD"):
            jvp(case.theirs, inputs, tangents, mode)
        with context, pytest.raises(NotImplementedError, match="forward AD"):
            jvp(f, inputs, tangents, mode)
        return
    want = jvp(case.reference_jvp or case.theirs, inputs, tangents, "jvp")
    with context, mps_ext.trace() as t:
        got = jvp(f, inputs, tangents, mode)
    kernels_ran(t)
    assert all(g is not None for g in got)
    case.check(tuple(got), tuple(want))


def test_forward_derivative_missing_raises():
    x = randn(4, 8)
    with forward_ad.dual_level(), pytest.raises(NotImplementedError, match="fp8_quantize has no forward"):
        fp8.quantize(forward_ad.make_dual(x, torch.ones_like(x)))


# --- every bias form of every linear path -----------------------------------------------------------------------

M, K, N = 3, 32, 16


def fp8_layer(bias):
    """An FP8Linear (per-channel scales) and the float weight it computes with."""
    linear = torch.nn.Linear(K, N, bias=bias)
    layer = mps_ext.nn.FP8Linear.from_linear(linear)
    return layer, fp8.dequantize(layer.weight, layer.weight_scale_inv)


BIASES = {"none": None, "1-D": (N,), "2-D": (1, N)}


@pytest.mark.parametrize("bias_form", BIASES)
@pytest.mark.parametrize("path", ["mps_ext.linear", "F.linear overrides", "fp8_linear", "FP8Linear"])
def test_backward_every_bias_form(path, bias_form, request):
    if (path == "fp8_linear" and bias_form == "2-D") or (path == "FP8Linear" and bias_form != "none"):
        pytest.skip("fp8_linear takes a 1-D bias; FP8Linear's bias is a buffer, not a parameter")
    if bias_form == "2-D":  # the kernels add a 1-D bias; torch takes the others
        request.applymarker(pytest.mark.fallback("bias not 1-D"))
    x = randn(M, K, seed=1).requires_grad_()
    bias = None if BIASES[bias_form] is None else randn(*BIASES[bias_form], seed=2).requires_grad_()
    if path.startswith("fp8") or path == "FP8Linear":
        layer, weight = fp8_layer(bias=False)
        weight = weight.requires_grad_(False)
        if path == "FP8Linear":
            ours = layer
        else:
            ours = lambda x: mps_ext.fp8_linear(x, layer.weight, layer.weight_scale_inv, bias)  # noqa: E731
    else:
        weight = randn(N, K, seed=3).requires_grad_()
        if path == "mps_ext.linear":
            ours = lambda x: mps_ext.linear(x, weight, bias)  # noqa: E731
        else:
            ours = lambda x: F.linear(x, weight, bias)  # noqa: E731
    leaves = [v for v in (x, weight, bias) if v is not None and v.requires_grad]
    grad_out = randn(M, N, seed=4)
    want = torch.autograd.grad(F.linear(x, weight, bias), leaves, grad_out)
    context = mps_ext.overrides.enabled("cpu") if path == "F.linear overrides" else contextlib.nullcontext()
    with context, mps_ext.trace() as t:
        got = torch.autograd.grad(ours(x), leaves, grad_out)
    if not (path == "mps_ext.linear" and bias_form == "2-D"):  # the kernels take a 1-D bias; torch runs the rest
        kernels_ran(t)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert_close(g, w, scale=4)
