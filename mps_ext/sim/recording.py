"""Launch recording: the host plans of mps_ext's ops, kept instead of run."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from typing import NamedTuple, Union

import torch

from .. import _C


class Binding(NamedTuple):
    """A tensor bound to a buffer slot: at ``offset`` bytes into its storage, spanning ``size`` bytes."""

    tensor: torch.Tensor
    offset: int
    size: int


class RecordedLaunch(NamedTuple):
    """One launch of a host plan (``dispatchThreadgroups``).

    ``args[i]`` binds to ``[[buffer(i)]]``: a :class:`Binding`, or the bytes
    of a parameter struct (``setBytes``). ``threadgroup_memory`` is the bytes
    of the kernel's threadgroup variables (Metal's
    ``staticThreadgroupMemoryLength``; 0 where the simulator does not compute
    it); the ops set no threadgroup memory of their own.
    """

    kernel: str
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    threadgroup_memory: int
    args: list[Union[Binding, bytes]]


class Recording:
    """What :func:`record_launches` kept; ``launches`` is filled when its block exits."""

    def __init__(self):
        self.launches: list[RecordedLaunch] = []
        self._recorded = None

    def replay(self) -> None:
        """Run the launches in the simulator, in order, on the recorded tensors (the ops' outputs fill in)."""
        if self._recorded is None:
            raise RuntimeError("replay: the recording is still open")
        self._recorded.replay()


FillPolicy = Union[int, Callable[[str, int], int], None]


def _fill_policy(fill: FillPolicy):
    """``fill_simdgroups`` as the callable the host asks, or None for the simulator's setting."""
    if fill is None:
        return None
    if callable(fill):
        return lambda kernel, threads: operator.index(fill(kernel, threads))
    if isinstance(fill, bool) or not isinstance(fill, int):
        raise TypeError(f"record_launches: fill_simdgroups must be an int or a callable, got {type(fill).__name__}")
    if fill <= 0:
        raise ValueError(f"record_launches: fill_simdgroups must be positive, got {fill}")
    return lambda kernel, threads: fill


ThreadLimit = Union[int, Callable[[str], int], None]


def _thread_limit(limit: ThreadLimit):
    """``max_threads`` as the callable the host asks, or None for the simulator's limits only."""
    if limit is None:
        return None
    if callable(limit):
        return lambda kernel: operator.index(limit(kernel))
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"record_launches: max_threads must be an int or a callable, got {type(limit).__name__}")
    if limit <= 0:
        raise ValueError(f"record_launches: max_threads must be positive, got {limit}")
    return lambda kernel: limit


@contextlib.contextmanager
def record_launches(fill_simdgroups: FillPolicy = None, max_threads: ThreadLimit = None):
    """Record the kernel launches mps_ext's ops make on CPU tensors inside the block, instead of running them.

    Each op runs its real host plan (validation, kernel choice, geometry,
    parameter structs, its own torch ops such as copies and allocations);
    each launch is kept as a :class:`RecordedLaunch`, with the tensors it
    binds, in the order made. The outputs the ops return are left unwritten
    until the launches run somewhere: :meth:`Recording.replay` runs them in
    the simulator; ``tools/cuda_check`` replays them on a CUDA GPU.

    ``fill_simdgroups`` sizes the plans (how many SIMD groups fill the GPU):
    an int, or a callable ``(kernel host name, threads per threadgroup) ->
    int`` for a per-kernel figure (a CUDA GPU's SMs times the warps of that
    kernel one SM keeps resident); by default the simulator's setting
    (:func:`gpu_cores`). ``max_threads`` limits the threads per threadgroup
    of each kernel where the launches will run: an int, or a callable
    ``(kernel host name) -> int`` (a translated kernel's launch bound on
    CUDA). A plan that needs more falls back as it does for a Metal pipeline
    whose ``maxTotalThreadsPerThreadgroup`` is lower, or raises naming the
    kernel where it has nothing to fall back to.

    A recording belongs to the thread that opens it, one at a time per
    thread: what other threads' ops launch meanwhile runs as ever. Torch ops on recorded outputs
    inside the block see unwritten memory: an op's own (``qr``'s R, the
    triangle of the factors its kernel writes; ``lu_factor``'s check of
    ``info``: record ``lu_factor_ex``) and yours. A launch recorded after such
    a read raises ``RuntimeError``, since its plan may rest on that memory.
    """
    policy, limit = _fill_policy(fill_simdgroups), _thread_limit(max_threads)
    recording = Recording()
    _C._record_begin(policy, limit)
    try:
        yield recording
    finally:
        recording._recorded = _C._record_end()
        recording.launches = [
            RecordedLaunch(kernel, grid, threadgroup, memory,
                           [a if isinstance(a, bytes) else Binding(*a) for a in args])
            for kernel, grid, threadgroup, memory, args in recording._recorded.launches()]
