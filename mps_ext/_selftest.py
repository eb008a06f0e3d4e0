"""``python -m mps_ext selftest``: every kernel this build ships, on each
backend available here, on small shapes, against torch on the CPU."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from . import _C, log_softmax, softmax, streams, trace
from .testing import TOLERANCES, max_error, mps_usable, reduction_scale

SHORT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


@dataclass
class Case:
    name: str
    # (device) -> (result, reference on the CPU, tolerance scale)
    run: Callable[[str], tuple[torch.Tensor, torch.Tensor, float]]


def softmax_cases() -> Iterator[Case]:
    ops = {"softmax": (softmax, torch.softmax), "log_softmax": (log_softmax, torch.log_softmax)}
    pairs = [(torch.float32, None), (torch.float16, None), (torch.bfloat16, None), (torch.float16, torch.float32),
             (torch.bfloat16, torch.float32)]
    shapes = [("simd", (11, 37), -1), ("simd", (9, 128), -1), ("block", (3, 129), -1), ("block", (2, 400), -1), ("split", (2, 5000), -1), ("strided", (2, 7, 600), 1),
              ("dim moved last", (2, 6, 5), 1)]
    for op, (ours, theirs) in ops.items():
        for dtype, out in pairs:
            for variant, shape, dim in shapes:
                def run(device, ours=ours, theirs=theirs, dtype=dtype, out=out, shape=shape, dim=dim):
                    x = (torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
                    got = ours(x.to(device), dim, dtype=out)
                    want = theirs(x, dim, dtype=torch.float32).to(out or dtype)
                    return got, want, reduction_scale(out or dtype, shape[dim], signed_terms=False)

                types = SHORT[dtype] + (f"->{SHORT[out]}" if out else "")
                yield Case(f"{op} {variant} {types} {tuple(shape)}", run)


def stream_cases() -> Iterator[Case]:
    def run(device):
        # Kernels on a side stream ordered with the default stream by events both ways.
        x = torch.randn(4, 300, generator=torch.Generator().manual_seed(0))
        side, default = streams.Stream(device), streams.current_stream(device)
        side.wait_stream(default)
        with streams.stream(side):
            got = log_softmax(softmax(x.to(device), -1), -1)
        done = side.record_event()
        default.wait_event(done)
        done.synchronize()
        return got, torch.log_softmax(torch.softmax(x, -1), -1), reduction_scale(torch.float32, 300, signed_terms=True)

    yield Case("streams: side stream and events (4, 300)", run)


def cases() -> list[Case]:
    return list(softmax_cases()) + list(stream_cases())


def run(out=print) -> bool:
    """Runs every case on every usable backend; prints a table; True if all pass and every kernel ran."""
    devices = [("simulator", "cpu")]
    usable, why = mps_usable()
    if usable:
        devices.append(("metal", "mps"))
    else:
        out(f"metal: skipped ({why})")
    ok = True
    out(f"{'backend':<10} {'case':<42} {'max |err|':>10}  result  kernels")
    for backend, device in devices:
        ran: set[str] = set()
        for case in cases():
            with trace() as t:
                got, want, scale = case.run(device)
            rtol, atol = TOLERANCES[got.dtype]
            err = max_error(got, want)
            good = bool(torch.isclose(got.cpu().double(), want.double(), rtol=rtol * scale, atol=atol * scale,
                                      equal_nan=True).all()) and all(k.backend == backend for k in t.kernels)
            ran.update(t.names)
            ok &= good
            out(f"{backend:<10} {case.name:<42} {err:>10.2e}  {'ok' if good else 'FAIL':<6}  {', '.join(t.names)}")
        missing = sorted(set(_C._sim_builtin_kernels()) - ran)
        if missing:
            ok = False
            out(f"{backend}: kernels no case ran: {', '.join(missing)}")
    return ok
