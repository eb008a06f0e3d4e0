"""torch's own Metal kernels (pytorch/pytorch aten/src/ATen/native/mps/kernels, the release's sources) as a
peer of the CUDA check ("torch-mps"), beside ggml-metal's and MLX's: their sources read at run time from a
directory (--torch-mps DIR, laid out as pytorch's tree: DIR/c10/metal/*.h, DIR/aten/src/ATen/native/mps/
kernels/*), never copied into this repository; each family's routing mirrors torch's host code
(operations/*.mm), named at each function.

    python3 tools/cuda_check/peer_torch.py extract --git-dir PYTORCH.git --rev v2.15.0 DIR   # or --tree CHECKOUT
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

import cuda
import peer_sources
from cuda import Launch, Module
from peer_plans import ceil_div
from translate_cuda import _METAL_CALLS

NAME, TITLE = "torch_mps", "torch-mps 2.15"
# The release the sources must come from (the tag, or the release/2.15 branch's head).
REVISION = "v2.15.0"
KERNELS = "aten/src/ATen/native/mps/kernels"
# What the kernels here include, as pytorch's tree names them: extract copies exactly these.
FILES = [f"{KERNELS}/{f}" for f in ("SoftMax.h", "SoftMax.metal", "Gemv.h", "ScaledMM.h", "GroupedMM.h")] + \
    [f"c10/metal/{h}.h" for h in ("common", "float8", "utils", "reduction_utils")]
# The directory of torch's sources for this run (peers.py --torch-mps DIR), None when none was given: every
# torch-mps cell is then not applicable.
SOURCES: Path | None = None
NO_SOURCES = "no torch sources given (--torch-mps DIR)"
# Where torch 2.15 has no counterpart of a case on the proxy, why (peer_cases reports the cell n/a).
NOT_ON_PROXY = {
    "gemv": "torch 2.15's gemv_nt (Gemv.h) is not on the proxy yet: the .metal file that instantiates it, with "
            "its GemvDims and GemmEpilogue declarations, is not among the extracted sources",
    "gemv_rows": "torch 2.15 runs no GEMV for more than one row: Gemv.h's kernels are rank-1 (M == 1), and its "
                 "few-row kernels (scaled_mm_few_rows) take e4m3fn activations only",
    "fp8": "torch 2.15's FP8 path (_scaled_mm, scaled_mm_few_rows) quantizes the activations to e4m3fn too; "
           "its kernel is not on the proxy yet",
    "moe": "torch 2.15's grouped_mm_few_rows (GroupedMM.metal) is not among the extracted sources",
}


# -- sources ----------------------------------------------------------------------------------------

def extract(dest: Path, tree: Path | None = None, git_dir: Path | None = None, rev: str = REVISION) -> list[Path]:
    """Copies FILES from a pytorch checkout (tree) or a git directory at rev into dest, in pytorch's layout."""
    out = []
    for rel in FILES:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if tree is not None:
            shutil.copyfile(tree / rel, target)
        else:
            show = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{rev}:{rel}"], capture_output=True,
                                  check=True)
            target.write_bytes(show.stdout)
        out.append(target)
    return out


# -- translation ------------------------------------------------------------------------------------

# The most threads per threadgroup torch's host launches each kernel with (kSoftmaxThreads: SoftMax.mm).
LAUNCH_BOUNDS = [(re.compile(r"(log_)?softmax_(row|partial|finalize)_"), 256), (re.compile(r"(log_)?softmax_"), 1024)]


class TorchTranslator(peer_sources.PeerTranslator):
    """The peers' translator, with include/peer_torch.h, and c10/metal's own max/min/fma/... declarations kept as
    declarations: the translator qualifies an unqualified Metal call with metal::, which a declarator (the name
    after its return type) is not."""

    headers = (*peer_sources.PeerTranslator.headers, "peer_torch.h")

    def rewrite_tokens(self):
        for i, tok in enumerate(self.t):
            if tok.kind == "id" and tok.text in _METAL_CALLS and self.text(i + 1) == "(" and self.declarator(i):
                self.replace(i, self.code(tok.text, i))  # kept as it is: rewrite_tokens skips replaced tokens
        super().rewrite_tokens()

    def declarator(self, i: int) -> bool:
        """Whether the name at i is declared there: a type (a name or a template's `>`) comes right before it."""
        prev = self.t[i - 1] if i else None
        if prev is None:
            return False
        return prev.text == ">" or (prev.kind == "id" and prev.text not in ("return", "else", "case", "co_return"))

    @staticmethod
    def launch_bound(host: str) -> int:
        for pattern, n in LAUNCH_BOUNDS:
            if pattern.match(host):
                return n
        return peer_sources.PeerTranslator.launch_bound(host)


def modules(sources: Path) -> list[Module]:
    """torch's modules: SoftMax.metal whole (its own instantiations), as Metal compiles it (__METAL__)."""
    sources = sources.resolve()
    include = [sources, sources / "aten" / "src"]
    return [Module("torch_softmax", sources / KERNELS / "SoftMax.metal", include, None, ("__METAL__",),
                   TorchTranslator)]


# -- routing and plans ------------------------------------------------------------------------------

METAL_TYPE = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}
SOFTMAX_THREADS, SIMDGROUP, MAX_NDIM = 256, 32, 16  # kSoftmaxThreads (SoftMax.h), c10::metal::simdgroup_size


def softmax_route(rows: int, cols: int) -> tuple:
    """Which kernel torch 2.15 runs for softmax over the last dim of a contiguous (rows, cols), as
    softmax_mps_impl (operations/SoftMax.mm) decides: ("row",) one SIMD group per row up to 1024 columns (2048
    with at least 128 rows); ("split", n_chunks, chunk_size) softmax_partial + softmax_finalize, chunks that fill
    512 threadgroups, none shorter than 2048; else ("general",) the 2D fallback."""
    row_dim_fits = cols <= 1024 or rows >= 128
    if cols <= 2048 and row_dim_fits:
        return ("row",)
    n_chunks = min(max(512 // rows, 1), ceil_div(cols, 2048))
    if n_chunks > 1:
        return ("split", n_chunks, ceil_div(cols, n_chunks))
    return ("general",)


def softmax_params(rows: int, cols: int, chunk: int, n_chunks: int) -> torch.Tensor:
    """SoftmaxParams<uint32_t> (SoftMax.h) as the host's narrow_params binds it: dim_size, num_rows, inner_size,
    chunk_size, n_chunks, ndim, dim, sizes[16], strides[16]."""
    sizes, strides = [rows, cols] + [0] * (MAX_NDIM - 2), [cols if rows > 1 else 0, 1] + [0] * (MAX_NDIM - 2)
    return cuda.u32s(cols, rows, 1, chunk, n_chunks, 2, 1, *sizes, *strides)


def softmax(x: torch.Tensor, y: torch.Tensor, partials: torch.Tensor | None = None) -> list[Launch]:
    """softmax_mps_impl's launches for x (rows, cols) contiguous (32-bit offsets: the _u32 kernels); partials:
    float32 (rows, n_chunks, 2) for the split route (softmax_partials_buffer)."""
    rows, cols = x.shape
    route, t = softmax_route(rows, cols), METAL_TYPE[x.dtype]
    if route[0] == "row":
        params = softmax_params(rows, cols, cols, 1)
        return [Launch(f"torch_softmax/softmax_row_{t}_u32", (ceil_div(rows, SOFTMAX_THREADS // SIMDGROUP), 1, 1),
                       (SOFTMAX_THREADS, 1, 1), [x, y, params])]
    if route[0] == "split":
        _, n_chunks, chunk = route
        params = softmax_params(rows, cols, chunk, n_chunks)
        grid = (n_chunks, rows, 1)
        return [Launch(f"torch_softmax/softmax_partial_{t}_u32", grid, (SOFTMAX_THREADS, 1, 1), [x, partials, params]),
                Launch(f"torch_softmax/softmax_finalize_{t}_u32", grid, (SOFTMAX_THREADS, 1, 1),
                       [x, y, partials, params])]
    raise ValueError(f"softmax {rows}x{cols}: torch's 2D fallback, not planned here")


def softmax_partials_buffer(x: torch.Tensor) -> torch.Tensor | None:
    """The split route's partials (max, sum per chunk), float32, or None for the other routes."""
    route = softmax_route(*x.shape)
    return torch.empty(x.shape[0], route[1], 2, device=cuda.DEV) if route[0] == "split" else None


def softmax_note(rows: int, cols: int) -> str:
    route = softmax_route(rows, cols)
    return "softmax_row" if route[0] == "row" else f"softmax_partial + softmax_finalize, {route[1]} chunks"


def main():
    ap = argparse.ArgumentParser(description="Extracts the torch sources the torch-mps peer reads.")
    ap.add_argument("command", choices=["extract"])
    ap.add_argument("dest", type=Path)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tree", type=Path, help="a pytorch checkout at the release")
    src.add_argument("--git-dir", type=Path, help="a pytorch git directory (with --rev)")
    ap.add_argument("--rev", default=REVISION)
    args = ap.parse_args()
    for path in extract(args.dest, args.tree, args.git_dir, args.rev):
        print(path)


if __name__ == "__main__":
    main()
