"""Build mps_ext._C: the simulator runtime, the kernels of metal/*.metal translated
for it, and on macOS with an MPS-enabled torch the Metal backend.

Install with torch already present and without build isolation, so the build
uses that torch instead of downloading another:
    pip install --no-build-isolation .
(With build isolation, tools/build_backend.py asks for the same torch version.)
The torch built against is recorded in mps_ext/_build.py, which `import mps_ext`
compares with the torch installed.
"""

import importlib.util
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = Path(__file__).resolve().parent
GENERATED = ROOT / "build" / "mtlsim"


def load_generator():
    spec = importlib.util.spec_from_file_location("generate_sources", ROOT / "tools" / "generate_sources.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generator = load_generator()


# The test kernels benchmarks/bench_simulator.py runs.
BENCH_KERNELS = ("softmax.metal", "gemv.metal", "lu.metal")


class build_py_with_headers(build_py):
    """Ships the simulator's headers inside the package, for compile_shader at
    run time, and the benchmarks (with the test kernels the simulator's
    benchmark runs), for ``python -m mps_ext bench`` from any install."""

    def run(self):
        super().run()
        package = Path(self.build_lib) / "mps_ext"
        shutil.rmtree(package / "sim" / "include", ignore_errors=True)
        shutil.copytree(ROOT / "csrc" / "sim" / "include", package / "sim" / "include")
        shutil.rmtree(package / "benchmarks", ignore_errors=True)
        shutil.copytree(ROOT / "benchmarks", package / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
        (package / "benchmarks" / "kernels").mkdir()
        for name in BENCH_KERNELS:
            shutil.copy(ROOT / "tests" / "kernels" / name, package / "benchmarks" / "kernels" / name)


class build_ext_kept(BuildExtension.with_options(use_ninja=True)):
    """An editable install (``pip install -e``, as ``./run`` does) compiles in
    build/editable instead of pip's temporary folder, so that ninja rebuilds
    only what changed since the last install."""

    def finalize_options(self):
        super().finalize_options()
        if getattr(self, "editable_mode", False):
            self.build_temp = str(ROOT / "build" / "editable")


def with_metal() -> bool:
    """The Metal backend is built on macOS with a torch that has MPS."""
    import torch

    return sys.platform == "darwin" and torch.backends.mps.is_built()


def record_torch() -> None:
    """mps_ext/_build.py: the torch the extension is compiled against."""
    import torch

    text = f'"""Written by setup.py."""\n\n# The torch mps_ext._C was compiled against.\nTORCH = "{torch.__version__}"\n'
    generator.write_if_changed(ROOT / "mps_ext" / "_build.py", text)


def extension():
    sources = [str(p) for p in generator.portable_sources()]
    sim_sources, metal_sources = generator.generated_sources(GENERATED)
    sources += [*sim_sources, *generator.unity_sources(GENERATED)]
    cxx = ["-O2", "-g1", "-fno-strict-aliasing", "-Wno-unknown-pragmas"]
    link = []
    if sys.platform == "linux":
        cxx.append("-fstack-clash-protection")  # see mps_ext/sim/compiler.py
    if with_metal():
        sources += [str(p) for p in sorted((ROOT / "csrc" / "metal").glob("*.mm"))] + [metal_sources]
        # No ARC: torch's MPS headers call retain/release explicitly.
        cxx += ["-DMPS_EXT_METAL=1", "-fno-objc-arc"]
        link += ["-framework", "Metal", "-framework", "Foundation"]
    return CppExtension(
        "mps_ext._C",
        sources=[str(Path(s).relative_to(ROOT)) if Path(s).is_relative_to(ROOT) else s for s in sources],
        include_dirs=[str(ROOT / "csrc"), str(ROOT / "csrc" / "sim" / "include"), str(ROOT / "metal" / "include")],
        extra_compile_args={"cxx": cxx},
        extra_link_args=link,
    )


record_torch()
setup(
    packages=find_packages(include=["mps_ext", "mps_ext.*"]),
    package_data={"mps_ext.sim": ["*.metal"]},
    ext_modules=[extension()],
    cmdclass={"build_ext": build_ext_kept, "build_py": build_py_with_headers},
)
