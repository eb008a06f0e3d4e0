"""The host's own plans on CUDA: an mps_ext op runs on CPU tensors inside
mps_ext.sim.record_launches (csrc/ops decides kernels, geometry and parameter
structs, as for Metal and the simulator), and its recorded launches are
replayed on the GPU with the translated kernels.

Each storage a recording binds is copied to the GPU once and bound at the
byte offset the recording gives, so launches that share a buffer (softmax's
partials, lu_solve's factors) share it here too; download() copies every
storage back, which fills in the op's CPU outputs.
"""

from __future__ import annotations

import torch

import mps_ext
from cuda import DEV, Launch
from translate_cuda import launch_bound

# Backend::fill_simdgroups for the recordings: None plans as the simulator does (dry runs); run.py sets the
# GPU's figure, its SMs x the warps of each kernel one SM keeps resident.
fill_simdgroups = None


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """t's whole storage as uint8."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


class Replay:
    """A recording's launches bound to GPU copies of the storages they use; `bound_to` maps a recorded
    tensor to a GPU tensor of the same sizes and strides whose storage stands for its storage instead (a
    case's own inputs, not copied)."""

    def __init__(self, recording: mps_ext.sim.Recording, bound_to: dict | None = None):
        self.recording = recording
        # CPU storage address: (CPU bytes, or None where bound; GPU bytes; byte shift of the recorded offsets)
        self._storages: dict[int, tuple] = {}
        for cpu, dev in (bound_to or {}).items():
            shift = (dev.storage_offset() - cpu.storage_offset()) * dev.element_size()
            self._storages[cpu.untyped_storage().data_ptr()] = (None, _bytes(dev), shift)
        self.launches = [Launch(l.kernel, l.grid, l.threadgroup, [self._bind(a) for a in l.args])
                         for l in recording.launches]

    def _bind(self, arg) -> torch.Tensor:
        if isinstance(arg, bytes):  # a parameter struct, as setBytes binds it
            return torch.frombuffer(bytearray(arg), dtype=torch.uint8).to(DEV)
        storage = arg.tensor.untyped_storage()
        if storage.data_ptr() not in self._storages:
            host = _bytes(arg.tensor)
            self._storages[storage.data_ptr()] = (host, host.to(DEV, copy=True), 0)  # a copy on the CPU too
        _, device, shift = self._storages[storage.data_ptr()]
        return device[shift + arg.offset:shift + arg.offset + arg.size]

    def on_device(self, t: torch.Tensor) -> torch.Tensor:
        """The GPU tensor that stands for the recorded tensor t (an op's output, after the launches ran)."""
        _, device, shift = self._storages[t.untyped_storage().data_ptr()]
        size = t.element_size()
        return torch.empty(0, dtype=t.dtype, device=device.device).set_(
            device.untyped_storage(), shift // size + t.storage_offset(), t.size(), t.stride())

    def download(self):
        """Copies every copied storage back to the CPU tensors the op returned."""
        for host, device, _ in self._storages.values():
            if host is not None:
                host.copy_(device)


def _fallbacks() -> dict[str, int]:
    return {op: s["fallbacks"] for op, s in mps_ext.overrides.stats().items()}


def record(op, *args, **kwargs):
    """(recording, result) of the mps_ext op on CPU tensors, planned with fill_simdgroups and each kernel's
    launch bound in the translation as its pipeline's thread limit; the result's tensors stay unwritten until a
    Replay of the recording runs and is downloaded."""
    before = _fallbacks()
    with mps_ext.sim.record_launches(fill_simdgroups, max_threads=launch_bound) as recording:
        result = op(*args, **kwargs)
    # A call left to torch has nothing of ours to check, and torch's CPU op would have read unwritten buffers.
    to_torch = sorted(name for name, n in _fallbacks().items() if n > before.get(name, 0))
    if to_torch:
        raise RuntimeError(f"{', '.join(to_torch)} left the call to torch (mps_ext.overrides.stats() says why)")
    return recording, result
