"""Streams and events for mps_ext's devices, with ``torch.cuda``'s API.

A stream is a queue of work that runs in order; work on different streams may
overlap, and events order it across streams and with the host. Each device
(``"mps"``: the GPU; ``"cpu"``: the simulator) has a default stream, the one
torch uses, and a current stream per thread, where mps_ext's kernels go::

    s = mps_ext.Stream("mps")
    s.wait_stream(mps_ext.current_stream("mps"))   # s sees what was enqueued so far
    with mps_ext.stream(s):
        y = mps_ext.softmax(x, -1)                 # enqueued on s; returns at once
    mps_ext.current_stream("mps").wait_stream(s)   # later work sees y
    mps_ext.record_stream(x, s)                    # x's memory outlives the work on s

As on CUDA, work on a non-default stream may not have run when the call that
enqueued it returns: synchronize (the stream, or an event recorded after the
work) before reading its results on the host. Launches keep their tensors
alive until they have run.

What follows the current stream (see the README for details):

- ``mps`` with torch 2.14 and 2.15: mps_ext's kernels and torch's own ops
  (the streams are torch's; on 2.15 ``torch.mps.current_stream()`` and
  :func:`current_stream` agree, and ``torch.mps.Stream`` objects are accepted
  wherever a stream is).
- ``mps`` with torch 2.13: mps_ext's kernels only (torch has one stream; mps_ext
  gives its streams command queues of their own). Torch ops stay on the
  default stream.
- ``cpu`` (the simulator): mps_ext's kernels, including those of
  ``mps_ext.sim.compile_shader`` libraries. The default stream runs work at
  once on the calling thread; every other stream runs its work in order on a
  thread of its own. Torch's CPU ops run on the calling thread, as on the
  default stream.

Where torch ops do not follow the stream, an mps_ext op's inputs must be ready
when it is called if it has to copy them (a non-contiguous input, a dtype
conversion, a fallback to torch); make the default stream wait for the stream
first (``mps_ext.current_stream(...)`` is then the default stream) or
synchronize it.
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from . import _C

__all__ = [
    "Event", "Stream", "current_stream", "default_stream", "hold", "record_stream", "set_stream", "stream",
    "synchronize",
]


def _default_device() -> torch.device:
    return torch.device("mps" if _C._has_metal() else "cpu")


def _device(device) -> torch.device:
    """mps_ext's devices: one ``cpu`` (the simulator) and one ``mps``."""
    if device is None:
        return _default_device()
    if isinstance(device, int):
        device = torch.device(_default_device().type, device)
    device = torch.device(device)
    if device.type not in ("cpu", "mps"):
        raise ValueError(f"mps_ext streams exist on 'mps' and 'cpu' (the simulator), got {device}")
    if device.index not in (None, 0):
        raise ValueError(f"mps_ext streams exist on one {device.type} device (index 0), got {device}")
    return torch.device(device.type)


# The streams of each device that this process has handed out or seen (synchronize waits for each).
_seen: dict[str, set[int]] = {"cpu": {0}, "mps": {0}}


class Stream:
    """A queue of work on ``device`` (default: ``"mps"`` when mps_ext has a Metal backend, else ``"cpu"``).

    Streams come from a pool of 32 per device, handed out in turn, as
    ``torch.cuda.Stream()`` does: a 33rd ``Stream()`` is the first one again.
    They live as long as the process. Two ``Stream`` objects are equal when
    they name the same stream.
    """

    device: torch.device
    stream_id: int

    def __init__(self, device=None):
        self.device = _device(device)
        self.stream_id = _C._stream_new(self.device.type)
        _seen[self.device.type].add(self.stream_id)

    @classmethod
    def _of(cls, device: torch.device, stream_id: int) -> Stream:
        s = cls.__new__(cls)
        s.device, s.stream_id = device, int(stream_id)
        _seen[device.type].add(s.stream_id)
        return s

    def synchronize(self) -> None:
        """Wait until all work enqueued on this stream has run.

        Raises the first error of a kernel that ran on it since the last
        synchronize (kernels on a non-default stream report errors here, not
        where they were enqueued); in the simulator, issues the
        ``mps_ext.sim.DivergenceWarning``\\ s of ``compile_shader`` kernels that ran on it.
        Ctrl-C stops the wait (``KeyboardInterrupt``); the work runs on.
        """
        _C._stream_synchronize(self.device.type, self.stream_id)
        if self.device.type == "cpu":
            from .sim import DivergenceWarning

            for message in _C._sim_stream_warnings(self.stream_id):
                warnings.warn(message, DivergenceWarning, stacklevel=2)

    def query(self) -> bool:
        """True when all work enqueued on this stream has run (on ``mps``: mps_ext's work; pending work is
        committed, so that a polling loop ends)."""
        return _C._stream_query(self.device.type, self.stream_id)

    def wait_event(self, event) -> None:
        """Make work enqueued on this stream from now on wait for ``event``'s last record.

        ``event`` is an :class:`Event` or, on ``mps``, a ``torch.mps.Event``
        (which torch records on the default stream).
        """
        if isinstance(event, torch.mps.Event):
            if self.device.type != "mps":
                raise RuntimeError(f"wait_event: a torch.mps.Event belongs to mps, the stream is on {self.device}")
            _C._wait_torch_event(self.device.type, self.stream_id, _torch_event_id(event))
            return
        if not isinstance(event, Event):
            raise TypeError(f"wait_event() expects an mps_ext.Event or a torch.mps.Event, got {type(event).__name__}")
        event.wait(self)

    def wait_stream(self, stream) -> None:
        """Make work enqueued on this stream from now on wait for all work enqueued on ``stream`` so far."""
        other = _as_stream(stream)
        if other.device != self.device:
            raise RuntimeError(f"wait_stream: a stream on {self.device} cannot wait for a stream on {other.device}")
        self.wait_event(other.record_event())

    def record_event(self, event=None):
        """Record ``event`` (a new :class:`Event` when None) on this stream and return it.

        A ``torch.mps.Event`` can be recorded on the default ``mps`` stream
        only (torch's limit); an :class:`Event` works on every stream.
        """
        if isinstance(event, torch.mps.Event):
            if self.device.type != "mps" or self.stream_id != 0:
                raise NotImplementedError(f"record_event: torch records a torch.mps.Event on the default mps stream "
                                          f"only, not on {self!r}: record an mps_ext.Event instead")
            with stream(self):
                event.record()
            return event
        event = Event() if event is None else event
        event.record(self)
        return event

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and (self.device, self.stream_id) == (other.device, other.stream_id)

    def __hash__(self) -> int:
        return hash((self.device.type, self.stream_id))

    def __repr__(self) -> str:
        return f"<mps_ext.Stream device={self.device} stream_id={self.stream_id}>"


def _as_stream(s) -> Stream:
    """An mps_ext.Stream, or a torch stream (``torch.mps.Stream`` on 2.15, ``torch.Stream``) on cpu or mps."""
    if isinstance(s, Stream):
        return s
    if isinstance(s, torch.Stream):
        return Stream._of(_device(s.device), s.stream_id)
    raise TypeError(f"expected an mps_ext.Stream or a torch stream, got {type(s).__name__}")


def _torch_event_id(event) -> int:
    """The id torch's event pool knows a ``torch.mps.Event`` by (a private attribute on torch 2.13-2.15)."""
    event_id = getattr(event, "_Event__eventId", None)
    if not isinstance(event_id, int):
        raise TypeError("this torch.mps.Event keeps no event id mps_ext knows how to read")
    return event_id


def default_stream(device=None) -> Stream:
    """The default stream of ``device``: the one torch's ops use."""
    return Stream._of(_device(device), 0)


def current_stream(device=None) -> Stream:
    """The calling thread's current stream on ``device``, where mps_ext's kernels go."""
    device = _device(device)
    return Stream._of(device, _C._stream_current(device.type))


def synchronize(device=None) -> None:
    """Wait until the work enqueued so far on every stream of ``device`` has run: its default stream and each
    stream handed out (or seen current) in this process.

    On torch 2.13 and 2.14 ``torch.mps.synchronize()`` waits for the default stream only, and torch never
    reads a command buffer's status: there a failed kernel of ours, even on the default stream, is raised by
    our synchronizes (this one, a stream's or an event's), not by torch's. Raises the first error of a kernel
    that ran on any of the streams since they were last synchronized, after waiting for all of them.
    """
    device = _device(device)
    first = None
    for stream_id in sorted(_seen[device.type]):
        try:
            Stream._of(device, stream_id).synchronize()
        except RuntimeError as e:
            first = first or e
    if first is not None:
        raise first


def set_stream(stream) -> None:
    """Make ``stream`` the calling thread's current stream on its device (prefer the :func:`stream` context)."""
    s = _as_stream(stream)
    _C._stream_set_current(s.device.type, s.stream_id)


@contextlib.contextmanager
def stream(stream):
    """Within the block, ``stream`` is the calling thread's current stream on its device.

    The previous current stream comes back when the block exits; blocks nest.
    ``None`` leaves the current stream as it is. Other threads are not
    affected (autograd's backward runs on threads of its own, on the default
    stream, unless they enter a block themselves).
    """
    if stream is None:
        yield
        return
    s = _as_stream(stream)
    previous = current_stream(s.device)
    set_stream(s)
    try:
        yield
    finally:
        set_stream(previous)


class Event:
    """A marker in a stream's work, with ``torch.cuda.Event``'s API.

    An event belongs to the device of the first stream it is recorded on.
    Until recorded it counts as done (``query()`` is True, waits and
    ``synchronize()`` return at once). ``enable_timing=True`` allows
    :meth:`elapsed_time`, measured with the GPU's timestamps on Metal and the
    host's clock in the simulator. On every torch version it works on every
    stream (torch 2.15's ``torch.mps.Event`` refuses non-default streams).
    """

    def __init__(self, enable_timing: bool = False):
        self.enable_timing = bool(enable_timing)
        self.device: torch.device | None = None
        self._impl = None

    def _stream_for(self, stream, what: str) -> Stream:
        s = current_stream(self.device) if stream is None else _as_stream(stream)
        if self.device is not None and s.device != self.device:
            raise RuntimeError(f"Event.{what}: the event belongs to {self.device}, the stream is on {s.device}")
        return s

    def record(self, stream=None) -> None:
        """Record the event on ``stream`` (default: the current stream); it is reached when the work enqueued
        on the stream so far has run. Replaces an earlier record."""
        s = self._stream_for(stream, "record")
        if self._impl is None:
            self._impl, self.device = _C._event_new(s.device.type), s.device
        self._impl.record(s.stream_id)

    def wait(self, stream=None) -> None:
        """Make work enqueued on ``stream`` (default: the current stream) from now on wait for this event.

        Does nothing when the event was never recorded. On the simulator's
        default stream, which is the calling thread, it waits here.
        """
        s = self._stream_for(stream, "wait")
        if self._impl is not None:
            self._impl.block(s.stream_id)

    def query(self) -> bool:
        """True when the event's last record has been reached (or it was never recorded)."""
        return self._impl is None or self._impl.query()

    def synchronize(self) -> None:
        """Wait until the event's last record has been reached (Ctrl-C stops the wait, not the work).

        On ``mps``, raises the first GPU error of the stream it was recorded on
        not yet raised, as that stream's :meth:`Stream.synchronize` would."""
        if self._impl is not None:
            self._impl.synchronize()

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds from this event's last record to ``end_event``'s; waits for both to be reached."""
        if not isinstance(end_event, Event):
            raise TypeError(f"elapsed_time() expects an mps_ext.Event, got {type(end_event).__name__}")
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._impl is None or end_event._impl is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if self.device != end_event.device:
            raise RuntimeError(f"elapsed_time: the events belong to {self.device} and {end_event.device}")
        self.synchronize()
        end_event.synchronize()
        return (end_event._impl.seconds() - self._impl.seconds()) * 1000.0

    def __repr__(self) -> str:
        return f"<mps_ext.Event device={self.device} enable_timing={self.enable_timing}>"


def record_stream(tensor: torch.Tensor, stream) -> None:
    """Keep ``tensor``'s memory from being reused before the work enqueued on ``stream`` so far has run.

    Use it for a tensor made on one stream and used by work on another, before
    letting go of it. mps_ext's own launches keep their tensors alive by
    themselves; this is for the rest (torch ops that follow the stream). The
    memory is held until the work enqueued on ``stream`` before this call has
    run, so call it after enqueuing the work that uses the tensor; with torch
    2.15 on ``mps`` it is also torch's ``Tensor.record_stream`` (which records
    nothing for the private-storage buffers of default MPS tensors).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"record_stream() expects a tensor, got {type(tensor).__name__}")
    s = _as_stream(stream)
    if tensor.device.type != s.device.type:
        raise RuntimeError(f"record_stream: the tensor is on {tensor.device}, the stream on {s.device}")
    _C._record_tensor(s.device.type, tensor, s.stream_id)


@contextlib.contextmanager
def hold(stream):
    """Simulator only: ``stream`` stops at this point of its work until the block exits.

    Work enqueued on it inside the block waits, so tests can observe an
    order between streams deterministically (``query()`` is False, another
    stream waiting for it waits too).
    """
    s = _as_stream(stream)
    if s.device.type != "cpu":
        raise ValueError(f"hold() holds simulator streams (on cpu), got one on {s.device}")
    release = _C._sim_stream_hold(s.stream_id)
    try:
        yield
    finally:
        release()
