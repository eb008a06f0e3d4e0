"""mps_ext.trace(): which kernels ran."""

from __future__ import annotations

from typing import NamedTuple

from . import _C


class KernelRecord(NamedTuple):
    """One kernel dispatch: its host name, threadgroups per grid, threads per threadgroup, and backend."""

    name: str
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    backend: str  # "simulator", "metal", or "recording" (mps_ext.sim.record_launches: kept, not run)


class trace:
    """Record every kernel dispatched inside a ``with`` block, on either backend::

        with mps_ext.trace() as t:
            torch.softmax(x, -1)
        print([k.name for k in t.kernels])

    ``t.kernels`` (a list of :class:`KernelRecord`) is filled when the block
    exits. Traces nest, may be open on several threads at once, and see
    kernels dispatched from any thread (autograd's backward, for instance).
    Dispatches that fail are not recorded. At most ``max_records`` are kept;
    ``t.dropped`` counts the rest.
    """

    def __init__(self, max_records: int = 100_000):
        if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 0:
            raise ValueError(f"max_records must be a non-negative int, got {max_records!r}")
        self.kernels: list[KernelRecord] = []
        self.dropped = 0
        self._max_records = max_records
        self._id = None

    def __enter__(self) -> trace:
        self._id = _C._trace_begin(self._max_records)
        return self

    def __exit__(self, *exc) -> None:
        records, self.dropped = _C._trace_end(self._id)
        self._id = None
        self.kernels = [KernelRecord(*r) for r in records]

    def __del__(self):
        # A trace entered and never exited stops recording when it is collected.
        if self._id is not None and _C is not None:
            _C._trace_end(self._id)

    @property
    def names(self) -> list[str]:
        """The host names of the recorded kernels, in dispatch order."""
        return [k.name for k in self.kernels]
