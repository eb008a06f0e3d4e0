#!/usr/bin/env python3
"""Compile mps_ext's macOS build on Linux, against the real macOS torch headers.

The Metal backend (csrc/metal/*.mm) and the portable sources it is linked
with (csrc/**/*.cpp and what setup.py generates) are compiled as setup.py
builds them on an Apple-silicon Mac, once per supported torch version, with
the headers of that version's macOS arm64 wheel:

- clang 19 for arm64-apple-macos14, so
  __APPLE__, __aarch64__, Apple's type sizes and -Wunguarded-availability are
  those of the Mac, and Apple's assembler checks the inline assembly;
- libc++ (Debian's libc++-19-dev), the C++ library of macOS;
- the macOS SDK's usr/include (libc, libdispatch, the Objective-C runtime,
  Availability.h), which the ziglang wheel ships: Debian's glibc cannot stand
  in, torch's headers check that int64_t is long long as on macOS;
- for Foundation, Metal and MetalPerformanceShaders(Graph), whose headers are
  not to be had here, the declarations in tools/macos_sdk_stubs/.

Objective-C++ is compiled twice, as with a macOS 14 and a macOS 15 SDK, and
goes once through clang's static analyzer, which checks the retain/release
balance of manual reference counting. Our files get -Wall -Wextra -Werror;
torch's and Apple's headers are system headers. Nothing is linked or run:
this catches what a compiler catches.

    python tools/check_macos.py                check everything (the Python must
                                               have torch: setup.py generates sources)
    python tools/check_macos.py --fetch-only   install clang, fetch the headers
    python tools/check_macos.py --torch 2.13.0 --sdk 15 FILE...   these files only

The wheels come from PyPI (sha256 checked) and only their headers are kept,
in $MPS_EXT_CACHE_DIR/macos-headers (default ~/.cache/mps_ext). clang-19 and
libc++-19-dev are installed with apt-get when missing.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from urllib.parse import urljoin

ROOT = Path(__file__).resolve().parent.parent
STUBS = ROOT / "tools" / "macos_sdk_stubs"
GENERATED = ROOT / "build" / "mtlsim"

TORCH_VERSIONS = ("2.13.0", "2.14.1", "2.15.0")
DEPLOYMENT = (14, 0)  # the oldest macOS mps_ext supports
SDKS = {"14": 140000, "15": 150000}  # __MAC_OS_X_VERSION_MAX_ALLOWED of each SDK
# ziglang 0.14.1 carries the usr/include of the macOS 15.1 SDK; it is built on
# LLVM 19, like the clang used here.
SDK_WHEEL = ("ziglang", "0.14.1", "manylinux_2_12_x86_64", "ziglang/lib/libc/include/any-macos-any/")

CLANG = "clang++-19"
LIBCXX = Path("/usr/lib/llvm-19/include/c++/v1")
APT_PACKAGES = ("clang-19", "libc++-19-dev")

# -fsyntax-only does not assemble: sources with inline assembly are compiled.
ASSEMBLY = re.compile(r"\b(asm|__asm__)\s*(volatile\s*)?\(")


def cache_dir() -> Path:
    base = os.environ.get("MPS_EXT_CACHE_DIR") or Path.home() / ".cache" / "mps_ext"
    return Path(base) / "macos-headers"


def torch_headers(version: str) -> Path:
    return cache_dir() / version


def sdk_headers() -> Path:
    return cache_dir() / "sdk-15.1"


def missing(versions=TORCH_VERSIONS) -> list[str]:
    """What the check needs and this machine does not have yet."""
    out = [f"{CLANG} and {LIBCXX}"] if not (shutil.which(CLANG) and LIBCXX.is_dir()) else []
    out += [f"the headers of torch {v} for macOS" for v in versions if not torch_headers(v).is_dir()]
    return out + (["the macOS SDK's C headers"] if not sdk_headers().is_dir() else [])


def install_clang() -> None:
    if shutil.which(CLANG) and LIBCXX.is_dir():
        return
    if os.geteuid() != 0:
        sys.exit(f"check_macos: needs {CLANG} and libc++: apt-get install {' '.join(APT_PACKAGES)}")
    print(f"check_macos: installing {' '.join(APT_PACKAGES)}", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *APT_PACKAGES]):
        result = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if result.returncode:
            sys.exit(f"check_macos: {' '.join(cmd)} failed:\n{result.stdout}{result.stderr}")


def fetch(package: str, version: str, wheel_tag: str, prefix: str, dest: Path) -> None:
    """Extracts the files under `prefix` of a wheel from PyPI into dest."""
    if dest.is_dir():
        return
    index = f"https://pypi.org/pypi/{package}/json"
    with urllib.request.urlopen(index, timeout=60) as r:
        files = json.load(r)["releases"].get(version, [])
    wheel = next((f for f in files if wheel_tag in f["filename"]), None)
    if wheel is None:
        sys.exit(f"check_macos: PyPI has no {package} {version} wheel for {wheel_tag}")
    print(f"check_macos: fetching {wheel['filename']} ({wheel['size'] >> 20} MiB)", flush=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        path, digest = Path(tmp) / wheel["filename"], hashlib.sha256()
        with urllib.request.urlopen(urljoin(index, wheel["url"]), timeout=60) as r, open(path, "wb") as f:
            while chunk := r.read(1 << 20):
                digest.update(chunk)
                f.write(chunk)
        if digest.hexdigest() != wheel["digests"]["sha256"]:
            sys.exit(f"check_macos: {wheel['filename']}: sha256 differs from PyPI's")
        out = Path(tmp) / "headers"
        with zipfile.ZipFile(path) as z:
            for member in z.infolist():
                if member.filename.startswith(prefix) and not member.is_dir():
                    target = out / member.filename[len(prefix):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(member) as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        try:
            out.rename(dest)  # whole or not at all: an interrupted fetch leaves no cache
        except OSError:
            if not dest.is_dir():  # else another run fetched it meanwhile
                raise


def fetch_all(versions) -> None:
    install_clang()
    jobs = [("torch", v, "-cp311-cp311-macosx_14_0_arm64.whl", "torch/include/", torch_headers(v)) for v in versions]
    jobs.append((*SDK_WHEEL, sdk_headers()))
    with ThreadPoolExecutor(len(jobs)) as pool:
        for job in [pool.submit(fetch, *j) for j in jobs]:
            job.result()


def generated_sources() -> list[Path]:
    """What setup.py generates and builds (the translated kernels, their
    registry, the embedded .metal sources), generated as it does."""
    result = subprocess.run([sys.executable, "setup.py", "-q", "--name"], cwd=ROOT, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"check_macos: setup.py could not generate its sources (run this with the Python that has torch, "
                 f"e.g. .venv/bin/python):\n{result.stderr}")
    return sorted(GENERATED.glob("*.cpp"))


@cache
def clang_include() -> Path:
    """clang's own headers (stddef.h, arm_neon.h...)."""
    resource = subprocess.run([CLANG, "-print-resource-dir"], capture_output=True, text=True, check=True).stdout
    return Path(resource.strip()) / "include"


def compile_command(source: Path, torch_include: Path, sdk: str, analyze: bool = False) -> list[str]:
    system = [
        LIBCXX, clang_include(), sdk_headers(), STUBS,
        torch_include, torch_include / "torch" / "csrc" / "api" / "include", sysconfig.get_paths()["include"],
    ]
    ours = [ROOT / "csrc", ROOT / "csrc" / "sim" / "include", ROOT / "metal" / "include"]
    major, minor = DEPLOYMENT
    if analyze:  # clang's static analyzer: retain/release balance under manual reference counting
        output = ["--analyze", "-Xclang", "-analyzer-werror", "-o", os.devnull]
    elif ASSEMBLY.search(source.read_text()):
        output = ["-c", "-o", os.devnull]
    else:
        output = ["-fsyntax-only"]
    return [
        CLANG, "-target", f"arm64-apple-macos{major}.{minor}", "-std=c++20", "-nostdinc", "-nostdinc++",
        *[a for d in system for a in ("-isystem", str(d))], *[a for d in ours for a in ("-I", str(d))],
        # Availability.h would set these from the target and its own SDK version.
        f"-D__MAC_OS_X_VERSION_MIN_REQUIRED={major * 10000 + minor * 100}",
        f"-D__MAC_OS_X_VERSION_MAX_ALLOWED={SDKS[sdk]}",
        # setup.py's flags on a Mac with an MPS-enabled torch, and torch.utils.cpp_extension's
        "-DMPS_EXT_METAL=1", "-fno-objc-arc", "-fno-strict-aliasing", "-Wno-unknown-pragmas",
        "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C",
        "-Wall", "-Wextra", "-Werror", *output, str(source),
    ]


def check(sources: list[Path], versions, sdks) -> tuple[int, int]:
    """Every source with every torch version; Objective-C++ with every SDK
    (only it has SDK-dependent code), the rest with the newest; and
    Objective-C++ through the static analyzer once."""
    jobs = [(s, v, sdk, False) for v in versions for s in sources
            for sdk in (sdks if s.suffix == ".mm" else sdks[-1:])]
    jobs += [(s, versions[-1], sdks[-1], True) for s in sources if s.suffix == ".mm"]

    def run(job):
        source, version, sdk, analyze = job
        cmd = compile_command(source, torch_headers(version), sdk, analyze)
        return job, subprocess.run(cmd, capture_output=True, text=True)

    failed = 0
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        for (source, version, sdk, analyze), result in pool.map(run, jobs):
            if result.returncode:
                failed += 1
                name = source.relative_to(ROOT) if source.is_relative_to(ROOT) else source
                what = "static analysis" if analyze else "compile"
                print(f"FAILED {what} of {name} (torch {version}, macOS {sdk} SDK):\n{result.stdout}{result.stderr}",
                      flush=True)
    return len(jobs) - failed, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fetch-only", action="store_true", help="install clang and fetch the headers, check nothing")
    parser.add_argument("--torch", action="append", choices=TORCH_VERSIONS, help="torch version (default: all)")
    parser.add_argument("--sdk", action="append", choices=list(SDKS), help="macOS SDK of .mm files (default: all)")
    parser.add_argument("files", nargs="*", type=Path, help="sources to check (default: the whole macOS build)")
    args = parser.parse_args()
    versions, sdks = args.torch or TORCH_VERSIONS, sorted(args.sdk or SDKS)
    fetch_all(versions)
    if args.fetch_only:
        return 0
    start = time.monotonic()
    sources = [f.resolve() for f in args.files] or [
        *sorted((ROOT / "csrc").rglob("*.mm")), *sorted((ROOT / "csrc").rglob("*.cpp")), *generated_sources()]
    passed, failed = check(sources, versions, sdks)
    print(f"check_macos: {len(sources)} sources, torch {', '.join(versions)}: {time.monotonic() - start:.0f} s")
    print(f"check_macos: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
