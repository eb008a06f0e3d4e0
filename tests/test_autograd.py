"""Autograd in both modes over every op: gradients (backward) and tangents
(torch.autograd.forward_ad, torch.func.jvp, torch.func.jacfwd) of mps_ext's
functions and of torch's ops with the overrides on, on each device, against
torch's on the CPU with the overrides off; in-place ops on every op's outputs;
backward for every bias form of every linear path; and both modes in every float
argument of the FP8 ops, in every form of their scales."""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import forward_ad

import mps_ext
from conftest import on, ran_kernels
from mps_ext import fp8
from op_cases import CASES, FP8_FORMS, floating, randn
from tolerances import assert_close, assert_close_normwise

ROUTES = ["mps_ext", "overrides"]


def route_of(case, route, device):
    """The function to differentiate and the context to run it in."""
    if route == "mps_ext":
        return case.ours, contextlib.nullcontext()
    if not case.overridden:
        pytest.skip(f"torch has no op that the overrides route to {case.name}")
    return case.theirs, mps_ext.overrides.enabled(device)


def gradients(f, inputs, differentiable, seed=7):
    """d(<outputs, random cotangents>)/d(differentiable inputs)."""
    inputs = [x.detach().requires_grad_(i in differentiable) for i, x in enumerate(inputs)]
    outs = floating(f(*inputs))
    cotangents = [randn(*o.shape, dtype=o.dtype, seed=seed + j).to(o.device) for j, o in enumerate(outs)]
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
def test_backward(case, route, device):
    f, context = route_of(case, route, device)
    inputs = case.make(0)
    if route == "overrides" and case.reference_backward:
        pytest.skip(f"torch has no backward for {case.name}: the overrides keep its autograd")
    want = gradients(case.reference_backward or case.theirs, inputs, case.differentiable)
    with context, mps_ext.trace() as t:
        got = on(device, lambda *xs: gradients(f, xs, case.differentiable), *inputs)
    ran_kernels(t, device)
    case.check(tuple(got), tuple(want))


@pytest.mark.parametrize("case", [c for c in CASES if c.overridden and not c.reference_backward], ids=repr)
def test_backward_after_the_overrides_are_disabled(case, device):
    # A graph recorded with the overrides on keeps the derivatives they chose (torch's linear derivative, whose
    # CPU kernel they give): its backward runs, and agrees, once they are off again.
    want = gradients(case.theirs, case.make(0), case.differentiable)

    def recorded_then_disabled(*xs):
        xs = [x.detach().requires_grad_(i in case.differentiable) for i, x in enumerate(xs)]
        with mps_ext.overrides.enabled(device):
            outs = floating(case.theirs(*xs))
        cotangents = [randn(*o.shape, dtype=o.dtype, seed=7 + j).to(o.device) for j, o in enumerate(outs)]
        assert device == "mps" or not mps_ext.overrides.is_enabled(device)
        return torch.autograd.grad(outs, [xs[i] for i in case.differentiable], cotangents)

    case.check(tuple(on(device, recorded_then_disabled, *case.make(0))), tuple(want))


def func_vjp(f, differentiable, seed=7):
    """``gradients`` through torch.func.vjp (torch.func.grad and jacrev are built on it)."""
    def vjp_of(*xs):
        def of(*diff):
            args = list(xs)
            for i, d in zip(differentiable, diff):
                args[i] = d
            return tuple(floating(f(*args)))

        outs, pull = torch.func.vjp(of, *[xs[i] for i in differentiable])
        return pull(tuple(randn(*o.shape, dtype=o.dtype, seed=seed + j).to(o.device) for j, o in enumerate(outs)))
    return vjp_of


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_func_vjp(case, device):
    # torch.func's reverse mode runs each op's backward inside its transform (the linear algebra ops' backward
    # once called requires_grad_, which torch.func refuses).
    inputs = case.make(0)
    with mps_ext.trace() as t:
        got = on(device, func_vjp(case.ours, case.differentiable), *inputs)
    ran_kernels(t, device)
    case.check(tuple(got), func_vjp(case.reference_backward or case.theirs, case.differentiable)(*inputs))


def hvp_by_double_backward(f, x, rest, v):
    x = x.detach().requires_grad_()
    (g,) = torch.autograd.grad(f(x, *rest), x, create_graph=True)
    return torch.autograd.grad((g * v).sum(), x)[0]


SECOND_ORDER = {  # H v (u^T H v for forward over forward) of a scalar f in x, by each composition
    "forward_over_reverse": lambda f, x, rest, u, v: torch.func.jvp(lambda y: torch.func.grad(f)(y, *rest), (x,),
                                                                      (v,))[1],
    "reverse_over_reverse": lambda f, x, rest, u, v: torch.func.grad(
        lambda y: (torch.func.grad(f)(y, *rest) * v).sum())(x),
    "forward_over_forward": lambda f, x, rest, u, v: torch.func.jvp(
        lambda y: torch.func.jvp(lambda z: f(z, *rest), (y,), (v,))[1], (x,), (u,))[1],
    "create_graph": lambda f, x, rest, u, v: hvp_by_double_backward(f, x, rest, v),
}


@pytest.mark.parametrize("mode", list(SECOND_ORDER))
@pytest.mark.parametrize("case", [c for c in CASES if not c.make(0)[0].is_complex()], ids=repr)
def test_second_derivatives(case, mode, device):
    # The outer derivative sees through each op's own derivative (its forward and jvp run with grad modes on
    # below their level; the linear algebra backward is a torch.func.vjp): once it saw constants, and second
    # derivatives came out 0 or partial, silently, and backward through backward raised. The reference is
    # torch's reverse over reverse (its forward over forward through linalg.solve_ex is wrong: finite
    # differences agree with reverse over reverse).
    first = case.differentiable[0]
    inputs = case.make(0)
    x, rest = inputs[first], inputs[:first] + inputs[first + 1:]
    weights = [randn(*o.shape, dtype=o.dtype, seed=5 + j) for j, o in enumerate(floating(case.theirs(*inputs)))]
    u, v = randn(*x.shape, seed=8), randn(*x.shape, seed=9)

    def loss(f):
        def of(x, *rest):
            outs = floating(f(*rest[:first], x, *rest[first:]))
            return sum((w.to(o.device) * o * o).sum() for w, o in zip(weights, outs))
        return of

    with mps_ext.trace() as t:
        got = on(device, lambda x, u, v, *rest: SECOND_ORDER[mode](loss(case.ours), x, rest, u, v), x, u, v, *rest)
    ran_kernels(t, device)
    Hv = SECOND_ORDER["reverse_over_reverse"](loss(case.reference_jvp or case.theirs), x, rest, u, v)
    want = (u * Hv).sum() if mode == "forward_over_forward" else Hv
    assert want.abs().max() > 0
    assert_close_normwise(got, want)  # chains of products: entries far below the largest cancel


@pytest.mark.parametrize("mode", ["forward_ad", "jvp", "jacfwd"])
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_forward_derivative(case, route, mode, device, request):
    if mode == "jacfwd":  # vmap batches the tangents (mps_ext/_vmap.py): more rows than the GEMV takes, and
        # matrices of batched views that are neither row- nor column-major
        request.applymarker(pytest.mark.fallback("rows > 8|neither row- nor column-major", required=False))
    f, context = route_of(case, route, device)
    inputs = case.make(0)
    if mode == "jacfwd" and any(x.is_complex() for x in inputs):
        pytest.skip("torch.func.jacfwd takes real inputs only")
    tangents = tangents_for(case, inputs)
    if mode == "jacfwd":  # the Jacobian in one input (the first differentiable)
        first = case.differentiable[0]
        tangents = tuple(t if i == first else None for i, t in enumerate(tangents))
    n = len(inputs)

    def jvp_there(f, mode):  # the primals and tangents on the device, the outputs' tangents back on the CPU
        return on(device, lambda *xs: jvp(f, xs[:n], xs[n:], mode), *inputs, *tangents)

    if route == "overrides" and case.reference_jvp:  # torch has no forward derivative: the same error with ours
        with pytest.raises(NotImplementedError, match="forward AD"):
            jvp(case.theirs, inputs, tangents, mode)
        with context, pytest.raises(NotImplementedError, match="forward AD"):
            jvp_there(f, mode)
        return
    wide = {torch.float32: torch.float64, torch.complex64: torch.complex128} if case.double_jvp else {}
    widen = lambda xs: tuple(x.to(wide[x.dtype]) if isinstance(x, torch.Tensor) and x.dtype in wide else x
                             for x in xs)
    want = jvp(case.reference_jvp or case.theirs, widen(inputs), widen(tangents), "jvp")
    with context, mps_ext.trace() as t:
        got = jvp_there(f, mode)
    ran_kernels(t, device)
    assert all(g is not None for g in got)
    case.check(tuple(got), tuple(want))


def test_missing_derivatives_raise():
    # Quantizing rounds, and so does a float8 product: differentiating through them raises rather than giving
    # zeros.
    x = randn(4, 8)
    with forward_ad.dual_level(), pytest.raises(NotImplementedError, match="fp8_quantize has no forward"):
        fp8.quantize(forward_ad.make_dual(x, torch.ones_like(x)))
    q, scale = fp8.quantize(x.requires_grad_())
    with pytest.raises(RuntimeError, match="fp8_quantize has no backward"):
        scale.sum().backward()
    scale = scale.detach().requires_grad_()
    out = mps_ext.scaled_mm(q, q.t(), scale, scale, out_dtype=torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="scaled_mm has no backward .* float8 output"):
        torch.autograd.grad(out, scale, torch.ones_like(out))


@pytest.mark.parametrize("made", ["grad_mode", "no_grad"])
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_in_place_on_outputs(case, made, device):
    # An in-place op on an op's outputs (nn.ReLU(inplace=True), y += r) works as on torch's, though the kernels
    # write some outputs as views of a buffer of their own: autograd refuses in-place ops on views that a custom
    # Function returns or that no-grad mode made.
    inputs = case.make(0)
    differentiable = case.differentiable if made == "grad_mode" else ()
    outs = floating(case.theirs(*inputs))
    residuals = [randn(*o.shape, dtype=o.dtype, seed=3 + j) for j, o in enumerate(outs)]
    cotangents = [randn(*o.shape, dtype=o.dtype, seed=7 + j) for j, o in enumerate(outs)]

    def modified(f, in_place):
        def run(*args):
            n = len(inputs)
            xs = [x.detach().requires_grad_(i in differentiable) for i, x in enumerate(args[:n])]
            rs = [r.detach().requires_grad_() for r in args[n:n + len(outs)]]
            with torch.no_grad() if made == "no_grad" else contextlib.nullcontext():
                ys = floating(f(*xs))
            ys = [y.mul_(2).add_(r) if in_place else y * 2 + r for y, r in zip(ys, rs)]
            return torch.autograd.grad(ys, [xs[i] for i in differentiable] + rs, args[n + len(outs):])
        return run

    args = (*inputs, *residuals, *cotangents)
    want = modified(case.reference_backward or case.theirs, in_place=False)(*args)
    try:
        with mps_ext.trace() as t:
            got = on(device, modified(case.ours, in_place=True), *args)
    except RuntimeError as e:  # the op's backward reads the output it modified: as torch's does
        assert "modified by an inplace operation" in str(e)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            modified(case.theirs, in_place=True)(*args)
        return
    ran_kernels(t, device)
    case.check(tuple(got), tuple(want))


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
def test_backward_every_bias_form(path, bias_form, device, request):
    if (path == "fp8_linear" and bias_form == "2-D") or (path == "FP8Linear" and bias_form != "none"):
        pytest.skip("fp8_linear takes a 1-D bias; FP8Linear's bias is a buffer, not a parameter")
    if bias_form == "2-D":  # the kernels add a 1-D bias; torch takes the others
        request.applymarker(pytest.mark.fallback("bias not 1-D"))
    x = randn(M, K, seed=1).requires_grad_()
    bias = None if BIASES[bias_form] is None else randn(*BIASES[bias_form], seed=2).requires_grad_()
    if path.startswith("fp8") or path == "FP8Linear":
        layer, weight = fp8_layer(bias=False)
        weight = weight.requires_grad_(False)
        layer = layer.to(device)
        if path == "FP8Linear":
            ours = lambda x, weight, bias: layer(x)  # noqa: E731
        else:
            ours = lambda x, weight, bias: mps_ext.fp8_linear(  # noqa: E731
                x, layer.weight, layer.weight_scale_inv, bias)
    else:
        weight = randn(N, K, seed=3).requires_grad_()
        ours = mps_ext.linear if path == "mps_ext.linear" else F.linear
    leaves = [v for v in (x, weight, bias) if v is not None and v.requires_grad]
    grad_out = randn(M, N, seed=4)
    want = torch.autograd.grad(F.linear(x, weight, bias), leaves, grad_out)

    def grads(x, weight, bias, grad_out):  # with respect to the leaves as the device has them
        there = [v for v in (x, weight, bias) if v is not None and v.requires_grad]
        return torch.autograd.grad(ours(x, weight, bias), there, grad_out)

    context = mps_ext.overrides.enabled(device) if path == "F.linear overrides" else contextlib.nullcontext()
    with context, mps_ext.trace() as t:
        got = on(device, grads, x, weight, bias, grad_out)
    if not (path == "mps_ext.linear" and bias_form == "2-D"):  # the kernels take a 1-D bias; torch runs the rest
        ran_kernels(t, device)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert_close(g, w, scale=4)


@pytest.mark.parametrize("path", ["mps_ext.linear", "fp8_linear", "FP8Linear"])
@pytest.mark.parametrize("after", ["relu_inplace", "residual"])
def test_in_place_after_linear_layers(path, after, device):
    # A transformer block's in-place ops on a linear's output, as on torch's linear.
    layer, weight = fp8_layer(bias=True)
    linears = {"mps_ext.linear": lambda x: mps_ext.linear(x, weight.to(x.device), layer.bias),
               "fp8_linear": lambda x: mps_ext.fp8_linear(x, layer.weight, layer.weight_scale_inv, layer.bias),
               "FP8Linear": layer}

    def block(linear):
        def run(x, r, grad):
            x, r = x.detach().requires_grad_(), r.detach().requires_grad_()
            y = linear(x)
            if after == "relu_inplace":
                y = torch.nn.ReLU(inplace=True)(y)
            else:
                y += r
            return torch.autograd.grad(y, (x, r), grad, allow_unused=True, materialize_grads=True)
        return run

    x, r, grad = randn(M, K, seed=1), randn(M, N, seed=2), randn(M, N, seed=3)
    want = block(lambda x: F.linear(x, weight, layer.bias))(x, r, grad)
    layer = layer.to(device)
    with mps_ext.trace() as t:
        got = on(device, block(linears[path]), x, r, grad)
    ran_kernels(t, device)
    for g, w in zip(got, want):
        assert_close(g, w, scale=4)


# --- FP8: every float argument, every form of the scales --------------------------------------------------------


@pytest.mark.parametrize("case", FP8_FORMS, ids=repr)
def test_fp8_derivatives_in_every_float_argument(case, device):
    # A scale's gradient agrees with its tangent (a missing one shows as None from backward, zeros from jacrev).
    # The Jacobian in each float argument by reverse mode (jacrev: the backward under vmap) and by forward mode
    # (jacfwd) equals torch's in float64, and a backward of one cotangent its contraction; gradcheck's
    # finite differences agree with both modes (the products are linear in each argument, so its float32
    # differences are exact to rounding), batched gradients and tangents included.
    inputs = case.make(0)
    wide = [x.double() if x.dtype == torch.float32 else x for x in inputs]
    out = case.theirs(*wide)
    cotangent = randn(*out.shape, seed=7)
    jacobians = [torch.func.jacrev(case.theirs, argnums=i)(*wide) for i in case.differentiable]
    for i, want in zip(case.differentiable, jacobians):
        assert want.abs().max() > 0
        for jacobian in (torch.func.jacrev, torch.func.jacfwd):
            with mps_ext.trace() as t:
                got = on(device, jacobian(case.ours, argnums=i), *inputs)
            ran_kernels(t, device)
            assert_close_normwise(got, want)
    wants = [torch.tensordot(cotangent.double(), J, out.dim()) for J in jacobians]

    def backward(cotangent, *xs):
        xs = [x.detach().requires_grad_(i in case.differentiable) for i, x in enumerate(xs)]
        return torch.autograd.grad(case.ours(*xs), [xs[i] for i in case.differentiable], cotangent)

    with mps_ext.trace() as t:
        got = on(device, backward, cotangent, *inputs)
    ran_kernels(t, device)
    for g, w in zip(got, wants):
        assert_close_normwise(g, w)

    def gradcheck(*xs):
        xs = [x.detach().requires_grad_(i in case.differentiable) for i, x in enumerate(xs)]
        return torch.autograd.gradcheck(case.ours, xs, eps=0.1, atol=1e-3, rtol=1e-3, fast_mode=True,
                                        check_forward_ad=True, check_batched_grad=True,
                                        check_batched_forward_grad=True)

    assert on(device, gradcheck, *inputs)
