"""torch.vmap over every op (and per-sample gradients, vmap of grad): results equal to torch's op applied to
each batch element on the CPU; the operators with a batching rule (mps_ext/_vmap.py) launch their kernels
once for the whole vmapped batch, the others once per element (torch's fallback)."""

import itertools

import pytest
import torch

import mps_ext
from mps_ext import fp8
from conftest import on, ran_kernels
from op_cases import CASES, FP8_FORMS, LINALG_SCALE, dequantized, floating, randn, well_conditioned
from tolerances import assert_close, assert_close_normwise

BATCH = 3
# The operators whose rule batches every input (the linears and the grouped matmuls: their input only).
RULES = {"softmax", "log_softmax", "lu_factor_ex", "lu_solve", "solve_ex", "inv_ex", "qr", "householder_product",
         "solve_triangular"}
INPUT_RULES = {"linear", "fp8_linear", "grouped_mm", "fp8_grouped_mm"}


def base(case) -> str:
    return case.name.removesuffix("_complex")


def stacked(elements, i, batched: bool, dim: int):
    """Input i of every element, stacked along ``dim``, or element 0's alone."""
    if not batched:
        return elements[0][i]
    return torch.stack([e[i] for e in elements], dim=dim)


def per_element(case, elements, batched):
    """torch's op on each element (the shared inputs from element 0), stacked as vmap stacks."""
    outs = [case.theirs(*[x if b else elements[0][i] for i, (x, b) in enumerate(zip(e, batched))])
            for e in elements]
    if isinstance(outs[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*outs))
    return torch.stack(outs)


def launches_of_one(case, device, inputs):
    with mps_ext.trace() as t:
        on(device, case.ours, *inputs)
    return len(t.kernels)


@pytest.mark.parametrize("which", ["all", "first"])
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_vmap(case, which, device):
    elements = [case.make(seed) for seed in range(BATCH)]
    n = len(elements[0])
    # Every input batched along its first dimension (each element contiguous, as torch's grouped and scaled
    # matmuls want theirs), or the first input alone along its last (vmap moves it to the front).
    batched = [which == "all" or i == 0 for i in range(n)]
    dim = 0 if which == "all" else -1
    inputs = [stacked(elements, i, b, dim) for i, b in enumerate(batched)]
    in_dims = tuple(dim if b else None for b in batched)
    with mps_ext.trace() as t:
        got = on(device, lambda *xs: torch.vmap(case.ours, in_dims=in_dims)(*xs), *inputs)
    ran_kernels(t, device)
    one = launches_of_one(case, device, elements[0])
    batches_at_once = base(case) in RULES or (base(case) in INPUT_RULES and which == "first")
    assert len(t.kernels) == (one if batches_at_once else BATCH * one), t.names
    case.check(got, per_element(case, elements, batched))


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_per_sample_gradients(case, device):
    # vmap(grad(f)): each element's gradient in its first differentiable input, the others shared.
    first = case.differentiable[0]
    elements = [case.make(seed) for seed in range(BATCH)]
    shared = list(elements[0])

    def loss(f):
        def of(x, *rest):
            args = [*rest[:first], x, *rest[first:]]
            return sum(torch.view_as_real(o).sum() if o.is_complex() else o.sum() for o in floating(f(*args)))
        return of

    rest = shared[:first] + shared[first + 1:]
    xs = torch.stack([e[first] for e in elements])
    in_dims = (0,) + (None,) * len(rest)
    with mps_ext.trace() as t:
        got = on(device, lambda *a: torch.func.vmap(torch.func.grad(loss(case.ours)), in_dims=in_dims)(*a), xs, *rest)
    ran_kernels(t, device)
    # torch._grouped_mm's own backward rejects the expanded gradient of a sum: its loop of products instead.
    reference = case.reference_jvp or case.theirs
    want = torch.stack([torch.func.grad(loss(reference))(e[first], *rest) for e in elements])
    case.check(got, want)


@pytest.mark.parametrize("op", [mps_ext.softmax, mps_ext.log_softmax])
def test_rowwise_dims(op, device):
    # The vmapped dimension anywhere, the reduced one counted from either end, 0-d elements, a dtype.
    x = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(0))
    theirs = {mps_ext.softmax: torch.softmax, mps_ext.log_softmax: torch.log_softmax}[op]
    for in_dim, dim in [(0, 0), (1, 1), (2, -1), (1, -2)]:
        with mps_ext.trace() as t:
            got = on(device, lambda v: torch.vmap(lambda e: op(e, dim), in_dims=in_dim)(v), x)
        assert len(t.kernels) == 1
        want = torch.stack([theirs(e, dim) for e in x.unbind(in_dim)])
        assert_close(got, want)
    scalars = x[:, 0, 0].bfloat16()
    with mps_ext.trace() as t:
        got = on(device, lambda v: torch.vmap(lambda e: op(e, 0, dtype=torch.float32))(v), scalars)
    assert len(t.kernels) == 1 and got.dtype == torch.float32
    assert_close(got, torch.stack([theirs(e, 0, dtype=torch.float32) for e in scalars]))
    for dim in (2, -3):
        with pytest.raises(IndexError, match="dim"):
            on(device, lambda v: torch.vmap(lambda e: op(e, dim))(v), x)


def test_linear_algebra_batches_line_up_or_run_per_element(device):
    # The vmapped dimension joins the operator's own batches when every input has as many (a shared system and
    # a right-hand side per element, vectors included); where they differ (a batch of systems against one
    # vector each, one factorization against batches of right-hand sides) it runs once per element.
    n = 6
    A, As = well_conditioned(1, n, seed=0)[0], well_conditioned(2, n, seed=1)
    LU, pivots = torch.linalg.lu_factor(A)
    vectors, matrices = randn(BATCH, n, seed=2), randn(BATCH, 2, n, 4, seed=3)
    calls = [  # ours, torch's, the inputs vmapped over, whether the batches line up
        (lambda A, v: mps_ext.solve(A, v), torch.linalg.solve, (A, vectors), True),
        (lambda A, v: mps_ext.solve(A, v), torch.linalg.solve, (As, vectors), False),
        (lambda LU, p, B: mps_ext.lu_solve(LU, p, B), torch.linalg.lu_solve, (LU, pivots, matrices), False),
        (lambda A, B: mps_ext.solve_triangular(A, B, upper=False), lambda A, B: torch.linalg.solve_triangular(
            A, B, upper=False), (A.tril(), matrices), False),
    ]
    for ours, theirs, inputs, line_up in calls:
        in_dims = (None,) * (len(inputs) - 1) + (0,)
        with mps_ext.trace() as one:
            on(device, ours, *inputs[:-1], inputs[-1][0])
        with mps_ext.trace() as t:
            got = on(device, lambda *xs: torch.vmap(ours, in_dims=in_dims)(*xs), *inputs)
        ran_kernels(t, device)
        assert len(t.kernels) == len(one.kernels) * (1 if line_up else BATCH), t.names
        want = torch.stack([theirs(*inputs[:-1], b) for b in inputs[-1]])
        assert_close(got, want, scale=LINALG_SCALE)


@pytest.mark.parametrize("fp8_weights", [False, True], ids=["bf16", "fp8"])
def test_moe_rows_batched_anywhere(fp8_weights, device):
    # The batch placed inside the rows, one launch: groups of several rows and an empty one, rows past the last
    # group (torch leaves them unwritten: not compared), the vmapped dimension in the middle. Weights batched
    # too run once per element.
    rows, k, n, written = 7, 32, 16, 5
    offs = torch.tensor([2, 2, written], dtype=torch.int32)
    x = randn(rows, BATCH, k, seed=0).bfloat16()
    if fp8_weights:
        weights = [fp8.quantize(randn(3, n, k, seed=s), dim=2) for s in (1, 2, 3)]
        scale = weights[0][1]
        weights = torch.stack([w for w, _ in weights])

        def ours(x, w):
            return mps_ext.fp8_grouped_mm(x, w, scale, offs)

        def theirs(x, w):
            return torch._grouped_mm(x.float(), (w.float() * scale).transpose(-2, -1), offs=offs).bfloat16()
    else:
        weights = torch.stack([randn(3, n, k, seed=s).bfloat16() for s in (1, 2, 3)])

        def ours(x, w):
            return mps_ext.grouped_mm(x, w.transpose(-2, -1), offs)

        def theirs(x, w):
            return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)

    for weight_dim, launches in [(None, 1), (0, BATCH)]:
        weight = weights if weight_dim == 0 else weights[0]
        with mps_ext.trace() as t:
            got = on(device, lambda *xs: torch.vmap(ours, in_dims=(1, weight_dim))(*xs), x, weight)
        ran_kernels(t, device)
        assert len(t.kernels) == launches, t.names
        want = torch.stack([theirs(e, weights[i] if weight_dim == 0 else weight) for i, e in enumerate(x.unbind(1))])
        assert_close(got[:, :written], want[:, :written], scale=4)


# The FP8 products in every form of their scales, block-wise ones included: their block_size, a list, comes to
# the rules with a list of in_dims (one None per entry), not a batch dimension.
FP8_PRODUCTS = [c for c in FP8_FORMS if c.name.startswith(("fp8_linear", "fp8_grouped_mm"))]


def batchings(cases):
    """(case, the inputs batched) for every non-empty subset of each case's inputs."""
    for case in cases:
        n = len(case.make(0))
        for r in range(1, n + 1):
            for which in itertools.combinations(range(n), r):
                yield pytest.param(case, which, id=f"{case.name}-{'+'.join(map(str, which))}")


@pytest.mark.parametrize("case, which", list(batchings(FP8_PRODUCTS)))
def test_fp8_vmap_every_batched_argument(case, which, device):
    # Equal to torch per element; the input (the rows) alone batched launches once, any other argument
    # batched (weights, scales, bias, offsets) once per element.
    elements = [case.make(seed) for seed in range(BATCH)]
    batched = [i in which for i in range(len(elements[0]))]
    inputs = [stacked(elements, i, b, 0) for i, b in enumerate(batched)]
    in_dims = tuple(0 if b else None for b in batched)
    with mps_ext.trace() as t:
        got = on(device, lambda *xs: torch.vmap(case.ours, in_dims=in_dims)(*xs), *inputs)
    ran_kernels(t, device)
    one = launches_of_one(case, device, elements[0])
    assert len(t.kernels) == (one if which == (0,) else BATCH * one), t.names
    case.check(got, per_element(case, elements, batched))


def per_sample(derivative, samples, shared):
    """``derivative`` of each sample (batched along the first dimension) with the ``shared`` arguments."""
    return torch.func.vmap(derivative, in_dims=(0,) + (None,) * len(shared))(samples, *shared)


@pytest.mark.parametrize("transform", ["grad", "jacrev"])
@pytest.mark.parametrize("case", FP8_PRODUCTS, ids=repr)
def test_fp8_per_sample_gradients(case, transform, device):
    # vmap(grad(f)) and vmap(jacrev(f)) in every float argument (input, scales, bias), each sample's input
    # batched, the rest shared, against a loop of torch's in float64 (sums of products that cancel: normwise).
    elements = [case.make(seed) for seed in range(BATCH)]
    shared = elements[0][1:]
    samples = torch.stack([e[0] for e in elements])
    weights = randn(*case.theirs(*elements[0]).shape, seed=5)

    def derivative(f):
        if transform == "jacrev":
            return torch.func.jacrev(f, argnums=case.differentiable)
        return torch.func.grad(lambda *args: (f(*args) * weights.to(args[0].device)).sum(), argnums=case.differentiable)

    with mps_ext.trace() as t:
        got = on(device, lambda *a: per_sample(derivative(case.ours), a[0], a[1:]), samples, *shared)
    ran_kernels(t, device)
    wide = [x.double() if x.dtype == torch.float32 else x for x in shared]
    want = [derivative(case.theirs)(e[0].double(), *wide) for e in elements]
    for g, w in zip(got, zip(*want)):
        assert_close_normwise(g, torch.stack(w))


@pytest.mark.parametrize("granularity", ["tensor", "channel", "block"])
def test_fp8_linear_layer_vmap_and_per_sample_gradients(granularity, device):
    # An FP8Linear under vmap, and each sample's gradients in its input and in the layer's scales and bias
    # (torch.func.functional_call: the buffers as arguments), against torch's linear of the dequantized weight.
    layer = mps_ext.nn.FP8Linear.from_linear(torch.nn.Linear(40, 20), granularity, block_size=(8, 16))
    weight, block = layer.weight.view(torch.float8_e4m3fn), layer.block_size
    samples = randn(BATCH, 3, 40, seed=1)

    def loss(f):
        return lambda x, scale, bias: f(x, scale, bias).square().sum()

    def ours(x, scale, bias):
        return torch.func.functional_call(layer, {"weight_scale_inv": scale, "bias": bias}, (x,))

    def theirs(x, scale, bias):
        return torch.nn.functional.linear(x, dequantized(weight, scale, block), bias)

    buffers = (layer.weight_scale_inv, layer.bias)
    want = torch.stack([theirs(x, *buffers) for x in samples])
    want_grads = [torch.func.grad(loss(theirs), argnums=(0, 1, 2))(x, *buffers) for x in samples]
    layer.to(device)
    with mps_ext.trace() as t:
        got = on(device, lambda xs, *b: torch.vmap(ours, in_dims=(0, None, None))(xs, *b), samples, *buffers)
        got_grads = on(device, lambda xs, *b: per_sample(torch.func.grad(loss(ours), argnums=(0, 1, 2)), xs, b),
                       samples, *buffers)
    ran_kernels(t, device)
    assert_close(got, want, scale=4)
    for g, w in zip(got_grads, zip(*want_grads)):
        assert_close_normwise(g, torch.stack(w))
