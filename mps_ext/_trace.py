"""mps_ext.trace(): which kernels ran."""

from __future__ import annotations

from typing import NamedTuple

from . import _C


class KernelRecord(NamedTuple):
    """One kernel dispatch: its host name, threadgroups per grid, threads per threadgroup, and backend."""

    name: str
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    backend: str  # "simulator" or "metal"


class trace:
    """Record every kernel dispatched inside a ``with`` block, on either backend::

        with mps_ext.trace() as t:
            torch.softmax(x, -1)
        print([k.name for k in t.kernels])

    ``t.kernels`` (a list of :class:`KernelRecord`) is filled when the block
    exits. Traces nest, may be open on several threads at once, and see
    kernels dispatched from any thread (autograd's backward, for instance).
    """

    def __init__(self):
        self.kernels: list[KernelRecord] = []
        self._id = None

    def __enter__(self) -> trace:
        self._id = _C._trace_begin()
        return self

    def __exit__(self, *exc) -> None:
        self.kernels = [KernelRecord(*r) for r in _C._trace_end(self._id)]

    @property
    def names(self) -> list[str]:
        """The host names of the recorded kernels, in dispatch order."""
        return [k.name for k in self.kernels]
