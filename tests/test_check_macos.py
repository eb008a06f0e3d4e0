"""tools/check_macos.py catches mistakes in the Metal backend that only a Mac
would otherwise show: each test plants one in a copy of csrc/metal/metal_backend.mm
and runs the check on the copy."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "check_macos.py"
BACKEND = ROOT / "csrc" / "metal" / "metal_backend.mm"


def _missing() -> list[str]:
    spec = importlib.util.spec_from_file_location("check_macos", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.missing()


# .ci/run fetches all this before the tests; elsewhere, without it, say what is missing.
if not os.environ.get("CI") and (_absent := _missing()):
    pytest.skip(f"needs {', '.join(_absent)}: run `python tools/check_macos.py --fetch-only` first",
                allow_module_level=True)


def run_check(source: Path, *torch: str, analyze: bool = True) -> subprocess.CompletedProcess:
    """The check of source with these torch versions and the macOS 15 SDK (without the static analyzer, which
    takes three compiles' time, where a test is not about it)."""
    options = [a for v in torch for a in ("--torch", v)] + ([] if analyze else ["--no-analyze"])
    return subprocess.run([sys.executable, str(TOOL), *options, "--sdk", "15", str(source)],
                          capture_output=True, text=True)


def check_planted(tmp_path: Path, old: str, new: str, *torch: str, header: str | None = None,
                  analyze: bool = True) -> subprocess.CompletedProcess:
    """Runs the check on a copy of the backend with old replaced by new (and
    header, which new needs, included)."""
    source = BACKEND.read_text()
    assert source.count(old) == 1, f"the backend no longer contains {old!r}: plant the mistake elsewhere"
    planted = tmp_path / BACKEND.name
    planted.write_text((f"#include <{header}>\n" if header else "") + source.replace(old, new))
    return run_check(planted, *torch, analyze=analyze)


def test_torch_function_missing_in_one_version(tmp_path):
    # getStreamFromPool() exists since torch 2.14: one run, each version's compile reported on its own.
    result = check_planted(tmp_path, "at::mps::getDefaultMPSStream()", "at::mps::getStreamFromPool()",
                           "2.13.0", "2.14.1", "2.15.0", analyze=False)
    assert result.returncode == 1
    assert "no member named 'getStreamFromPool' in namespace 'at::mps'" in result.stdout
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED")]
    assert failed == [f"FAILED compile of {tmp_path / BACKEND.name} (torch 2.13.0, macOS 15 SDK):"], result.stdout


def test_misspelt_selector(tmp_path):
    # Only a warning for clang (the message could exist at run time): the check makes it an error.
    result = check_planted(tmp_path, "setBytes:a.bytes.data() length:", "setBytes:a.bytes.data() size:", "2.15.0")
    assert result.returncode == 1
    assert "instance method '-setBytes:size:atIndex:' not found" in result.stdout


def test_macos15_api_without_available(tmp_path):
    # mps_ext supports macOS 14: the macOS 15 SDK's mathMode needs a run-time check.
    result = check_planted(tmp_path, "if (@available(macOS 15.0, *)) {", "{", "2.15.0")
    assert result.returncode == 1
    assert "'setMathMode:' is only available on macOS 15.0 or newer" in result.stdout


def test_leak_under_manual_reference_counting(tmp_path):
    # The static analyzer sees that the compile options are never released.
    result = check_planted(tmp_path, "      [options release];\n", "", "2.15.0")
    assert result.returncode == 1
    assert "Potential leak of an object stored into 'options'" in result.stdout


def test_torch_function_not_exported(tmp_path):
    # ATen/native/DispatchStub.h declares at::native::get_cpu_capability() without TORCH_API:
    # it compiles and links, but no torch version's dylibs export it, so `import mps_ext`
    # would fail on every Mac. (at::get_cpu_capability() of ATen/Version.h is exported.)
    cores = '{"gpu cores", std::to_string(gpu_cores(device))},'
    capability = '{"cpu capability", std::to_string(int(at::native::get_cpu_capability()))},'
    result = check_planted(tmp_path, cores, cores + capability, "2.15.0", header="ATen/native/DispatchStub.h",
                           analyze=False)
    assert result.returncode == 1
    assert f"FAILED link of {tmp_path / BACKEND.name} (torch 2.15.0, macOS 15 SDK)" in result.stdout
    assert "at::native::get_cpu_capability()  [__ZN2at6native18get_cpu_capabilityEv]" in result.stdout
    result = run_check(BACKEND, "2.15.0", analyze=False)
    assert result.returncode == 0, result.stdout
