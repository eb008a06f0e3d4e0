"""The Metal simulator: run Metal compute kernels on the CPU.

``compile_shader`` has the calling convention of ``torch.mps.compile_shader``
and runs on CPU tensors, so a kernel written for the GPU can be executed and
tested on any machine::

    lib = mps_ext.sim.compile_shader('''
        kernel void full(device float* out, constant float& val,
                         uint idx [[thread_position_in_grid]]) { out[idx] = val; }''')
    x = torch.zeros(16)
    lib.full(x, 3.14)

``checked()`` turns on the checks for races, divergence and out-of-bounds
accesses (``MPS_EXT_SIM_CHECK=1`` does so for the whole process).
``record_launches()`` keeps the launches mps_ext's ops plan on CPU tensors
instead of running them, for the simulator or another executor to replay.
"""

from __future__ import annotations

import contextlib
import operator
import warnings
from collections.abc import Sequence

import torch

from .. import _C
from . import compiler
from .compiler import CompileError
from .recording import Binding, RecordedLaunch, Recording, record_launches

__all__ = [
    "Binding", "CompileError", "DivergenceWarning", "Kernel", "Library", "RecordedLaunch", "Recording",
    "SimulatorError", "checked", "compile_shader", "compile_file", "dispatch", "flush_half_subnormals", "gpu_cores",
    "record_launches",
]

SimulatorError = _C.SimulatorError
MAX_THREADS_PER_THREADGROUP = 1024
MAX_THREADGROUP_MEMORY = 32 * 1024
MAX_BUFFER_SLOTS = 31
THREAD_EXECUTION_WIDTH = 32


class DivergenceWarning(RuntimeWarning):
    """A SIMD-group function or barrier ran in divergent control flow (undefined or lane-dependent on the GPU)."""


@contextlib.contextmanager
def checked(compare_schedules: bool = True, timeout: float | None = None):
    """Run every kernel dispatched inside the block in checked mode.

    Checked mode runs each dispatch three times, with the GPU threads of a
    threadgroup scheduled forward, in reverse and in a seeded random order,
    on copies of the buffers that end at guard pages and with threadgroup
    memory poisoned (all bits set), and requires identical results. It
    reports, as ``SimulatorError``: a missing barrier or other race (results
    differ between schedules), reads of threadgroup memory nobody wrote,
    out-of-bounds buffer accesses (buffer, byte offset, thread and ``.metal``
    line), threadgroup memory over 32 KiB and threadgroups over 1024 threads.

    ``compare_schedules=False`` runs one schedule and keeps the other checks,
    for kernels whose results legitimately depend on thread order (slots
    handed out by an atomic counter, float atomics). ``timeout`` (seconds)
    stops a dispatch that runs longer with a ``SimulatorError`` (overriding
    ``MPS_EXT_SIM_TIMEOUT``). Divergent SIMD-group functions and barriers are
    reported as ``DivergenceWarning`` in every mode.

    Blocks nest and may be open on several threads at once: a thread's
    dispatches follow its own innermost block; threads with none open
    (autograd's, for instance) follow the most recently opened one.
    """
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
        if not 0 < timeout < float("inf"):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    token = _C._sim_push_checked(bool(compare_schedules), float(timeout or 0))
    try:
        yield
    finally:
        _C._sim_pop_checked(token)


@contextlib.contextmanager
def flush_half_subnormals():
    """Run every kernel dispatched inside the block on a GPU that flushes half denormals.

    MSL leaves it to the GPU whether a half subnormal survives: inside the
    block the simulator reads and writes every subnormal half value (a
    conversion's result, a bit pattern reinterpreted as half) as the zero of
    its sign, so a kernel whose results depend on half subnormals shows it.
    Float subnormals are kept. The setting is process-wide (every stream and
    thread); the previous one comes back at the end.
    """
    previous = _C._sim_set_flush_half_subnormals(True)
    try:
        yield
    finally:
        _C._sim_set_flush_half_subnormals(previous)


@contextlib.contextmanager
def gpu_cores(cores: int):
    """Plan grids inside the block as for an Apple GPU with ``cores`` cores.

    The host sizes grids by how many SIMD groups fill the GPU: on Metal the
    GPU's core count times the SIMD groups a core keeps resident; in the
    simulator the same with this setting (32 cores unless changed), so tests
    can show what an op launches on an 8-core M1 and on an 80-core Ultra. The
    setting is process-wide; the previous value comes back at the end.
    """
    if isinstance(cores, bool) or not isinstance(cores, int):
        raise TypeError(f"gpu_cores: cores must be an int, got {type(cores).__name__}")
    if cores <= 0:
        raise ValueError(f"gpu_cores: cores must be positive, got {cores}")
    previous = _C._sim_gpu_cores()
    _C._sim_set_gpu_cores(cores)
    try:
        yield
    finally:
        _C._sim_set_gpu_cores(previous)


def _as_tuple(value, what: str, smallest: int = 0) -> tuple[int, ...]:
    try:
        values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
        if any(isinstance(v, bool) for v in values):
            raise TypeError
        values = tuple(operator.index(v) for v in values)
    except TypeError:
        raise TypeError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}") from None
    if not 1 <= len(values) <= 3:
        raise ValueError(f"{what} must have 1 to 3 dimensions, got {len(values)}")
    if any(v < smallest or v >= 2 ** 32 for v in values):
        raise ValueError(f"{what} must be between {smallest} and 2**32 - 1 in every dimension, got {values}")
    return values


def _threadgroup_lengths(memory) -> list[int]:
    """``{index: bytes}`` as the 31 lengths of Metal's threadgroup argument table."""
    lengths = [0] * MAX_BUFFER_SLOTS
    for index, length in dict(memory or {}).items():
        if isinstance(index, bool) or not isinstance(index, int) or isinstance(length, bool) or \
                not isinstance(length, int):
            raise TypeError(f"threadgroup_memory must map int indices to int byte counts, got {index!r}: {length!r}")
        if not 0 <= index < MAX_BUFFER_SLOTS:
            raise ValueError(f"threadgroup_memory: index {index} is outside Metal's table (0 to "
                             f"{MAX_BUFFER_SLOTS - 1})")
        if not 0 <= length <= MAX_THREADGROUP_MEMORY:
            raise ValueError(f"threadgroup_memory: {length} bytes at index {index}; Metal allows 0 to "
                             f"{MAX_THREADGROUP_MEMORY} bytes of threadgroup memory")
        lengths[index] = length
    if sum(lengths) > MAX_THREADGROUP_MEMORY:
        raise ValueError(f"threadgroup_memory: {sum(lengths)} bytes in all; Metal allows {MAX_THREADGROUP_MEMORY}")
    return lengths


def _dim3(value: tuple[int, ...]) -> tuple[int, int, int]:
    return tuple(value) + (1,) * (3 - len(value))


_CASTS = {"fp16": torch.float16, "bf16": torch.bfloat16, "int32": torch.int32, "int16": torch.int16,
          "int8": torch.int8, "uint8": torch.uint8}


def _scalar_bytes(value, cast: str | None, index: int) -> bytes:
    """Python numbers as torch.mps.compile_shader binds them: int64 / float32, or the requested cast."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values:
        raise ValueError(f"argument {index}: an empty list cannot be passed to a kernel")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise TypeError(f"argument {index}: expected a tensor, an int, a float or a list of them, "
                        f"got {type(values[0]).__name__}")
    if cast is None:
        dtype = torch.float32 if isinstance(values[0], float) else torch.int64
    elif cast in _CASTS:
        dtype = _CASTS[cast]
    else:
        raise ValueError(f"argument {index}: unsupported cast {cast!r} (supported: {', '.join(_CASTS)})")
    return torch.tensor(values, dtype=dtype).view(torch.uint8).numpy().tobytes()


class Kernel:
    """One kernel of a :class:`Library`, callable like ``torch.mps.compile_shader``'s kernels."""

    max_threads_per_threadgroup: int
    thread_execution_width = THREAD_EXECUTION_WIDTH
    # Bytes of threadgroup memory its threadgroup variables take (Metal's staticThreadgroupMemoryLength).
    static_thread_group_memory_length: int

    def __init__(self, library: Library, name: str, max_threads: int, threadgroup_memory: int):
        self._library = library
        self.name = name
        self.max_threads_per_threadgroup = max_threads or MAX_THREADS_PER_THREADGROUP
        self.static_thread_group_memory_length = threadgroup_memory

    def __repr__(self) -> str:
        return f"<mps_ext.sim.Kernel {self.name!r}>"

    def __call__(self, *args, threads=None, group_size=None, arg_casts=None, threadgroup_memory=None):
        """Dispatch the kernel over ``threads`` (``dispatchThreads``: edge threadgroups may be partial).

        Tensor arguments bind, in order, to ``[[buffer(i)]]`` (CPU tensors, at
        their storage offset), as do ``bytes`` (e.g. a ``struct.pack``-ed
        parameter struct); Python ints bind as int64 and floats as float32
        unless ``arg_casts`` (a cast name for all scalars, or ``{index: cast}``)
        says ``"fp16"``, ``"bf16"``, ``"int32"``, ``"int16"``, ``"int8"`` or
        ``"uint8"``; lists bind as arrays. ``threads`` defaults to the first
        tensor's ``numel()``, ``group_size`` to as many threads as allowed.
        ``threadgroup_memory`` (``{index: bytes}``) sets the lengths of
        ``[[threadgroup(i)]]`` parameters.
        """
        buffers = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if a.device.type != "cpu":
                    raise ValueError(f"argument {i}: the simulator runs on CPU tensors, got a tensor on "
                                     f"{a.device}; use torch.mps.compile_shader for mps tensors")
                if threads is None:
                    threads = a.numel()
                buffers.append(a)
            elif isinstance(a, (bytes, bytearray)):
                buffers.append(bytes(a))  # raw bytes, e.g. a packed parameter struct
            else:
                cast = arg_casts.get(i) if isinstance(arg_casts, dict) else arg_casts
                buffers.append(_scalar_bytes(a, cast, i))
        if threads is None:
            raise ValueError("threads must be given when no tensor is passed")
        threads = _as_tuple(threads, "threads")
        if group_size is None:
            group_size = (min(max(threads[0], 1), self.max_threads_per_threadgroup),) + (1,) * (len(threads) - 1)
        group_size = _as_tuple(group_size, "group_size", smallest=1)
        if len(group_size) != len(threads):
            raise ValueError(f"group_size {group_size} and threads {threads} must have the same number of dimensions")
        dispatch(self._library, self.name, buffers, _dim3(threads), _dim3(group_size),
                 _threadgroup_lengths(threadgroup_memory), grid_in_threads=True)


def dispatch(library: Library, kernel: str, buffers: Sequence, grid, threadgroup, threadgroup_lengths=(),
             grid_in_threads: bool = True) -> None:
    """Low-level dispatch: ``buffers[i]`` (a CPU tensor, ``bytes`` or None) binds to ``[[buffer(i)]]``.

    ``grid_in_threads`` selects ``dispatchThreads`` (grid counts threads) over
    ``dispatchThreadgroups`` (grid counts threadgroups).
    """
    if len(threadgroup_lengths) > MAX_BUFFER_SLOTS:
        raise ValueError(f"threadgroup_lengths: Metal's table has {MAX_BUFFER_SLOTS} entries, got "
                         f"{len(threadgroup_lengths)}")
    lengths = list(threadgroup_lengths) + [0] * (MAX_BUFFER_SLOTS - len(threadgroup_lengths))
    for message in _C._sim_dispatch(library._handle, kernel, list(buffers), tuple(grid), tuple(threadgroup),
                                    lengths, grid_in_threads):
        warnings.warn(message, DivergenceWarning, stacklevel=3)


class Library:
    """Kernels compiled for the simulator; kernels are attributes, by host name."""

    def __init__(self, path):
        self._handle = _C._sim_load_module(str(path))
        self._kernels = {name: Kernel(self, name, *info) for name, *info in _C._sim_kernels(self._handle)}
        self.path = path

    def __getattr__(self, name: str) -> Kernel:
        kernels = self.__dict__.get("_kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(f"no kernel named {name!r} in this library (kernels: {', '.join(sorted(kernels))})")

    def __dir__(self):
        return sorted(self._kernels)


def compile_shader(source: str, *, name: str = "shader", include_dirs=(), constants=None,
                   msl_version: str = "3.1") -> Library:
    """Compile Metal Shading Language ``source`` for the simulator (cached on disk by content).

    Mirrors ``torch.mps.compile_shader``: the result has one callable per
    kernel host name. Raises :class:`CompileError` with the compiler's
    diagnostics when it does not compile, or naming the MSL rule a source
    breaks; they and the simulator's reports name lines of
    ``<cache>/<name>-<hash>.metal``, a copy of ``source`` (``name`` must be a
    plain file name). ``constants`` (``{name or index: bool, int or float}``)
    gives the values of the source's ``[[function_constant(i)]]`` constants, as
    ``MTLFunctionConstantValues`` does; each set of values is compiled (and
    cached) separately. ``msl_version`` ("3.1", the default, or "3.2") is the
    MSL the source targets, as ``MTLCompileOptions.languageVersion``:
    ``__METAL_VERSION__`` and the rules that depend on it follow it, and 3.2
    adds shader logging (``<metal_logging>``: what kernels log with ``os_log``
    is written to stderr after each dispatch).

    The kernels are compiled to native code and run inside this process with
    its privileges: never pass source you would not run as a program.
    """
    return Library(compiler.compile_source(source, name, include_dirs, constants, msl_version))


def compile_file(path, *, include_dirs=(), constants=None, msl_version: str = "3.1") -> Library:
    """Like :func:`compile_shader` for a ``.metal`` file; its directory is searched for includes."""
    return Library(compiler.compile_file(path, include_dirs, constants, msl_version))
