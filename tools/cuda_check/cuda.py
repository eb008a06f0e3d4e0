"""Builds the translated kernels and launches them on torch's current CUDA stream.

The CUDA driver API is reached through ctypes (no compiled helper): modules are
cubins loaded with cuModuleLoadData, kernels are the `extern "C"` trampolines
named by their Metal host names, launched with cuLaunchKernel.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import re
import shutil
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from translate_cuda import ROOT, SYMBOL_PREFIX, CudaTranslator, translate

HERE = Path(__file__).resolve().parent
# Where replays and references run: "cpu" runs the cases on a machine without a GPU (run.py --dry-run: the
# recordings replayed in the simulator).
DEV = os.environ.get("CUDA_CHECK_DEVICE", "cuda")
# Metal's argument table, as mtlcuda.h's Args (kBufferSlots): the launch passes it whole.
BUFFER_SLOTS = 31
NVCC_FLAGS = ["-cubin", "-arch=sm_90", "-std=c++17", "-use_fast_math", "-lineinfo", "-I", str(HERE / "include")]
# Whether a translation compiles, in seconds: nvcc's front end and unoptimized PTX, no ptxas (a full build
# of fp8.metal takes minutes, nearly all of it optimizing).
NVCC_CHECK_FLAGS = ["-ptx", "-arch=sm_90", "-std=c++17", "-use_fast_math", "-Xcicc", "-O0", "-I", str(HERE / "include")]


def nvcc_path() -> str:
    for cand in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).exists():
            return cand
    raise RuntimeError("nvcc not found")


@dataclasses.dataclass
class Module:
    """One .metal file and how to translate it; its cubin is named after `name`."""

    name: str
    source: Path
    include_dirs: list[Path]
    constants: dict | None = None  # [[function_constant]] values
    defines: tuple = ()
    translator: type = CudaTranslator

    @classmethod
    def of(cls, source: Path) -> "Module":
        """One of the project's .metal files."""
        return cls(source.stem, source, [ROOT / "metal" / "include"])

    def hosts(self) -> list[str]:
        """The host names of its kernels."""
        return [e.host for e in self.translate()[1]]

    def translate(self):
        """(CUDA source, kernels), as translate_cuda.translate."""
        return translate(self.source, self.include_dirs, self.constants, self.defines, self.translator)


def build(sources: list, out: Path, log=print, check_only: bool = False) -> dict[str, Path]:
    """Translates and compiles each .metal file (a path, or a Module); returns {name: cubin}. Reuses a cubin
    built from the same translation, shim and flags (by content: a copied checkout has new file times).
    check_only: unoptimized PTX instead of a cubin (NVCC_CHECK_FLAGS), for tests that the translation compiles."""
    out.mkdir(parents=True, exist_ok=True)
    flags, suffix = (NVCC_CHECK_FLAGS, ".ptx") if check_only else (NVCC_FLAGS, ".cubin")
    nvcc = nvcc_path()
    modules = [s if isinstance(s, Module) else Module.of(s) for s in sources]
    shim = "".join(p.read_text() for p in sorted((HERE / "include").glob("*.h")))

    def one(module: Module):
        cu, cubin = out / f"{module.name}.cu", out / f"{module.name}{suffix}"
        text, _ = module.translate()
        key = out / f"{module.name}{suffix}.key"
        digest = hashlib.sha256("\0".join([text, shim, *flags]).encode()).hexdigest()
        if cubin.exists() and key.exists() and key.read_text() == digest:
            return module.name, cubin, "cached"
        cu.write_text(text)
        proc = subprocess.run([nvcc, *flags, "-o", str(cubin), str(cu)], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"nvcc failed for {module.source}:\n{proc.stderr[-4000:]}")
        key.write_text(digest)
        return module.name, cubin, "built"

    with ThreadPoolExecutor(max_workers=len(modules)) as pool:
        results = list(pool.map(one, modules))
    for name, _, how in results:
        log(f"  {name}: {how}")
    return {name: cubin for name, cubin, _ in results}


class Driver:
    """The few driver calls the launcher needs."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        torch.zeros(1, device="cuda")  # torch makes the primary context current
        self.modules = {}
        self.functions: dict[str, ctypes.c_void_p] = {}
        self.max_threads: dict[str, int] = {}

    def check(self, rc, what):
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: CUDA error {rc} ({name.value.decode() if name.value else '?'})")

    def load(self, stem: str, cubin: Path, names: list[str], prefix: str = ""):
        """Loads a cubin; its kernels are launched as prefix + host name (two modules may hold one host name
        built with other function constants)."""
        data = cubin.read_bytes()
        module = ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(data)), f"loading {cubin}")
        self.modules[stem] = (module, data)
        for name in names:
            fn = ctypes.c_void_p()
            self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), module, (SYMBOL_PREFIX + name).encode()), f"kernel {name}")
            self.functions[prefix + name] = fn
            limit = ctypes.c_int()
            self.check(self.lib.cuFuncGetAttribute(ctypes.byref(limit), 0, fn), f"attributes of {name}")
            self.max_threads[prefix + name] = limit.value  # CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK

    def resident(self, name: str, threads: int) -> int:
        """Threadgroups of this size one SM holds at once (registers, shared memory, thread limits)."""
        n = ctypes.c_int()
        self.check(self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), self.functions[name],
                                                                         ctypes.c_int(threads), ctypes.c_size_t(0)),
                   f"occupancy of {name}")
        return n.value

    def alloc(self, nbytes: int) -> "Raw":
        """A plain cuMemAlloc of exactly nbytes (never freed: for the planted controls)."""
        ptr = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cuMemAlloc")
        return Raw(ptr.value)

    def launch(self, name: str, grid, block, addresses: list[int], smem: int = 0):
        args = (ctypes.c_uint64 * BUFFER_SLOTS)(*addresses, *([0] * (BUFFER_SLOTS - len(addresses))))
        params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        stream = torch.cuda.current_stream().cuda_stream
        g = (list(grid) + [1, 1])[:3]
        b = (list(block) + [1, 1])[:3]
        if b[0] * b[1] * b[2] > self.max_threads[name]:
            raise RuntimeError(f"{name}: {b} threads, the kernel takes at most {self.max_threads[name]} "
                               f"(LAUNCH_BOUNDS in translate_cuda.py)")
        rc = self.lib.cuLaunchKernel(self.functions[name], ctypes.c_uint(g[0]), ctypes.c_uint(g[1]),
                                     ctypes.c_uint(g[2]), ctypes.c_uint(b[0]), ctypes.c_uint(b[1]),
                                     ctypes.c_uint(b[2]), ctypes.c_uint(smem), ctypes.c_void_p(stream), params, None)
        self.check(rc, f"launching {name} grid {g} block {b}")


class Raw:
    """A device address that is not a tensor, bound like one."""

    def __init__(self, address: int):
        self.address = address

    def data_ptr(self) -> int:
        return self.address


def resource_usage(cubin: Path) -> dict[str, dict[str, int]]:
    """{host name: {REG, STACK, SHARED, LOCAL}} from cuobjdump (empty when it is not installed)."""
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if not Path(tool).exists():
        return {}
    proc = subprocess.run([tool, "--dump-resource-usage", str(cubin)], capture_output=True, text=True)
    usage, name = {}, None
    for line in proc.stdout.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            name = m.group(1)
            name = name[len(SYMBOL_PREFIX):] if name.startswith(SYMBOL_PREFIX) else None
            continue
        if name and "REG:" in line:
            usage[name] = {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}
    return usage


def u32s(*values) -> torch.Tensor:
    """A parameter struct of uint32 fields as a device buffer (what setBytes binds)."""
    raw = struct.pack(f"<{len(values)}I", *(int(v) & 0xFFFFFFFF for v in values))
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(DEV)


class Launch:
    """One dispatch: host name, threadgroups, threads per threadgroup, buffers by slot, and the bytes of
    threadgroup memory the host sets (setThreadgroupMemoryLength) for [[threadgroup(0)]]."""

    def __init__(self, kernel: str, grid, threads, buffers: list[torch.Tensor], smem: int = 0):
        self.kernel, self.grid, self.threads, self.buffers = kernel, tuple(grid), tuple(threads), buffers
        self.smem = smem
        self.addresses = [b.data_ptr() for b in buffers]

    @property
    def threadgroups(self) -> int:
        n = 1
        for g in self.grid:
            n *= g
        return n


class Launcher:
    def __init__(self, driver: Driver, trace=None):
        self.driver = driver
        self.launched: set[str] = set()
        self.trace = trace  # called with each host name before its launch (sanitizer attribution)

    def run(self, launches: list[Launch]):
        for l in launches:
            if self.trace:
                self.trace(l.kernel)
            self.launched.add(l.kernel)
            self.driver.launch(l.kernel, l.grid, l.threads, l.addresses, l.smem)
            if self.trace:
                torch.cuda.synchronize()


def env_no_caching() -> dict:
    """Every tensor its own cudaMalloc, so memcheck sees accesses past any tensor's end."""
    env = dict(os.environ)
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return env
