"""Seeded differential fuzzing: every op family on random views of its inputs
(transposed, sliced, expanded, at a storage offset, with lazy negative and
conjugate bits), called directly or through the overrides, on each device, on
the default stream or a side stream, from one or two threads at once, against
torch on the CPU on materialized copies with the overrides off."""

import random
import threading

import pytest
import torch

import mps_ext
from conftest import backend, to_cpu, to_device
from op_cases import CASES


def transposed(x, rng):
    return x.mT.contiguous().mT if x.dim() >= 2 else x


def sliced(x, rng):
    """Every other element of a wider tensor: stride 2 in the last dimension, storage offset 1."""
    wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1] + 1, dtype=x.dtype)
    wide[..., 1::2] = x
    return wide[..., 1:-1:2] if x.dim() else x


def offset(x, rng):
    flat = torch.zeros(x.numel() + 5, dtype=x.dtype)
    flat[5:] = x.reshape(-1)
    return flat[5:].view(x.shape)


def expanded(x, rng):
    """The first batch entry (row, matrix) broadcast over the others: stride 0."""
    return x[:1].expand(x.shape) if x.dim() >= 2 else x


def lazy_bit(x, rng):
    if x.is_complex() and rng.random() < 0.5:
        return x.conj_physical().conj()
    if not x.is_complex() and rng.random() < 0.5:
        return torch.complex(torch.zeros_like(x), -x).conj().imag
    return torch._neg_view(-x)


LAYOUTS = [transposed, sliced, offset, expanded]


def viewed(case, inputs, rng):
    """Each input as a random view (or itself): lazy bits on floating inputs only, layouts that keep rows
    contiguous where the kernels need them."""
    out = []
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor) or rng.random() < 0.3:
            out.append(x)
            continue
        floating = (x.is_floating_point() or x.is_complex()) and x.element_size() > 1
        if not floating and x.dtype == torch.int32:  # offsets and pivots: values that must stay as they are
            out.append(x)
            continue
        views = [offset, expanded] if i in case.row_major else LAYOUTS
        view = rng.choice(views + [lazy_bit] if floating else views)
        out.append(view(x, rng))
    return out


def expected(case, inputs):
    """torch's result on contiguous copies, and the type of the error torch's own op raises on these views
    (None if it takes them): ours may raise it too (the overrides keep torch's rules)."""
    try:
        case.theirs(*inputs)
        error = None
    except (RuntimeError, ValueError) as e:
        error = type(e)
    return error, case.theirs(*[x.resolve_conj().resolve_neg().contiguous() if isinstance(x, torch.Tensor) else x
                                for x in inputs])


def run_or_error(case, route, inputs, stream, error):
    """The outputs, or the exception when it is torch's for these views."""
    try:
        return run(case, route, inputs, stream)
    except Exception as e:  # noqa: BLE001 - checked against torch's
        if error is None or not isinstance(e, error):
            raise AssertionError(f"{case.name} ({route}) on {describe(inputs)}") from e
        return e


def job(seed):
    """(case, route, views of its inputs) for one seeded draw."""
    rng = random.Random(seed)
    case = CASES[seed % len(CASES)]
    route = "overrides" if case.overridden and rng.random() < 0.5 else "mps_ext"
    return case, route, viewed(case, case.make(seed), rng)


def describe(inputs):
    return [(tuple(x.shape), x.stride(), x.storage_offset(), x.is_neg(), x.is_conj()) if isinstance(x, torch.Tensor)
            else x for x in inputs]


def run(case, route, inputs, stream):
    with mps_ext.stream(stream):
        out = case.theirs(*inputs) if route == "overrides" else case.ours(*inputs)
    if stream is not None:
        stream.synchronize()
    return out


SEEDS = range(96)


# Views torch's own op rejects go to torch, which raises (accepted as the expected result).
@pytest.mark.fallback("invalid arguments|scaling recipe", required=False)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("side_stream", [False, True], ids=["default_stream", "side_stream"])
def test_fuzz(side_stream, threads, device):
    jobs = [job(seed * threads + t) for seed in SEEDS for t in range(threads)]
    wants = [expected(case, inputs) for case, _, inputs in jobs]
    jobs = [(case, route, [to_device(device, x) for x in inputs]) for case, route, inputs in jobs]
    # How many kernels each job dispatches alone: a job that fell back to torch would show as 0.
    counts = []
    with mps_ext.overrides.enabled(device):
        for (case, route, inputs), (error, _) in zip(jobs, wants):
            with mps_ext.trace() as t:
                got = run_or_error(case, route, inputs, None, error)
            assert t.kernels or isinstance(got, Exception), f"{case.name} ({route}) ran no kernel on {describe(inputs)}"
            assert all(k.backend == backend(device) for k in t.kernels), t.names
            counts.append(len(t.kernels))
        gots = [None] * len(jobs)
        for first in range(0, len(jobs), threads):
            group = range(first, first + threads)
            streams = [mps_ext.Stream(device) if side_stream else None for _ in group]

            def work(i, stream):
                case, route, inputs = jobs[i]
                try:
                    gots[i] = run_or_error(case, route, inputs, stream, wants[i][0])
                except AssertionError as e:  # reported below, with the job
                    gots[i] = e

            with mps_ext.trace() as t:
                workers = [threading.Thread(target=work, args=(i, s)) for i, s in zip(group, streams)]
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
            assert len(t.kernels) == sum(counts[i] for i in group), [jobs[i][0].name for i in group]
    for (case, route, inputs), got, (error, want) in zip(jobs, gots, wants):
        if isinstance(got, AssertionError):
            raise got
        if not isinstance(got, Exception):
            case.check(to_cpu(device, got), want)
