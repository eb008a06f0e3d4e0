#!/usr/bin/env bash
# Installs mps_ext as a user would and checks what the README promises of that install (Linux):
# a clean clone of this checkout's HEAD, a fresh venv with torch, `pip install ".[strict]"` with build
# isolation on and no system clang on PATH, then, outside the source tree: an op through the simulator,
# `python -m mps_ext info` (the strict front end from the ziglang package), a kernel of one's own with MSL's
# address spaces checked, `python -m mps_ext bench`; with OTHER_TORCH, that torch installed over the one
# built against and the ImportError that `import mps_ext` must then raise. Prints each step's time.
#
#   tools/install_check.sh [WORKDIR]    (default: a new temporary directory)
#   TORCH=torch==2.13.0                 the torch installed first
#   OTHER_TORCH=torch==2.14.1           optional: installed last, over TORCH
#   PYTHON=python3                      the Python of the venv
#
# The build compiles every kernel: many minutes on two cores. Zig's first compile builds its libc++ into
# its cache (ZIG_GLOBAL_CACHE_DIR, default ~/.cache/zig): minutes more, once.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d)}
mkdir -p "$work"
work=$(cd "$work" && pwd)
torch_req=${TORCH:-torch==2.13.0}
venv=$work/venv
py=$venv/bin/python

step() {  # step DESCRIPTION COMMAND...: runs it, output to $work/log, and prints its time
  local what=$1 start=$SECONDS
  shift
  printf '%-72s' "$what" >&2
  if "$@" >>"$work/log" 2>&1; then
    echo " ok ($((SECONDS - start)) s)" >&2
  else
    echo " FAILED ($((SECONDS - start)) s); the log: $work/log" >&2
    tail -n 30 "$work/log" >&2
    exit 1
  fi
}

# PATH with every clang* taken out: a directory that holds one is replaced by links to its other programs.
hide_clang() {
  local dir n=0 kept=()
  IFS=: read -r -a dirs <<<"$PATH"
  for dir in "${dirs[@]}"; do
    [ -d "$dir" ] || continue
    if compgen -G "$dir/clang*" >/dev/null; then
      n=$((n + 1))
      mkdir -p "$work/path/$n"
      ln -sf "$dir"/* "$work/path/$n/"
      rm -f "$work/path/$n"/clang*
      dir=$work/path/$n
    fi
    kept+=("$dir")
  done
  (IFS=:; echo "${kept[*]}")
}

PATH=$(hide_clang)
export PATH MPS_EXT_CACHE_DIR=$work/cache
unset MPS_EXT_SIM_CXX MPS_EXT_SIM_ADDRESS_SPACES
cd "$work"  # nothing below may see the source tree
echo "install_check: $work (log: $work/log)" >&2

step "clone $root (HEAD)" git clone -q "$root" "$work/src"
step "python -m venv" "${PYTHON:-python3}" -m venv "$venv"
step "pip install $torch_req" "$py" -m pip install "$torch_req"
step 'pip install "src[strict]" (build isolation on, no clang on PATH)' "$py" -m pip install "$work/src[strict]"
step "an op through the simulator" "$py" -c '
import torch, mps_ext
import torch.nn.functional as F
x, w = torch.randn(1, 256), torch.randn(512, 256)
with mps_ext.trace() as t, mps_ext.overrides.enabled("cpu"):
    y = F.linear(x, w)
assert t.kernels, "no mps_ext kernel ran"
torch.testing.assert_close(y, F.linear(x, w))
print("F.linear ran", [k.name for k in t.kernels])'
step "python -m mps_ext info: the simulator keeps address spaces" \
  sh -c "'$py' -m mps_ext info | tee -a '$work/info' && grep -q 'compiler .*ziglang c++, address spaces kept' '$work/info'"
step "a kernel of one's own, address spaces checked (zig's first compile)" \
  env MPS_EXT_SIM_ADDRESS_SPACES=1 "$py" -c '
import torch, mps_ext.sim
head = "#include <metal_stdlib>\nusing namespace metal;\n"
x = torch.arange(4.0)
mps_ext.sim.compile_shader(head + """
kernel void twice(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) { x[i] *= 2; }
""").twice(x, threads=4, group_size=4)
assert x.tolist() == [0, 2, 4, 6], x
try:  # Metal forbids a threadgroup pointer to device memory
    mps_ext.sim.compile_shader(head + """
kernel void bad(device float* d [[buffer(0)]]) { threadgroup float* p = d; p[0] = 1; }
""")
except mps_ext.sim.CompileError as e:
    assert "threadgroup float" in str(e), e
else:
    raise AssertionError("a device pointer converted to threadgroup compiled")
print("twice ran; the conversion to threadgroup was rejected")'
step "python -m mps_ext bench --repeat 1" "$py" -m mps_ext bench --repeat 1 --out "$work/bench"
if [ -n "${OTHER_TORCH:-}" ]; then
  step "pip install $OTHER_TORCH (over the torch built against)" "$py" -m pip install "$OTHER_TORCH"
  step "import mps_ext: the ImportError naming both torch versions and the fix" sh -c "
    ! '$py' -c 'import mps_ext' 2>'$work/mismatch' && cat '$work/mismatch' &&
    grep -q 'ImportError: mps_ext was built against torch .*, but torch .* is installed' '$work/mismatch' &&
    grep -q 'pip install --no-build-isolation \. ' '$work/mismatch'"
  tail -n 1 "$work/mismatch" >&2
fi
echo "install_check: all steps passed" >&2
