"""Interpolation as image and video pipelines call it (F.interpolate: nearest, nearest-exact, bilinear, bicubic,
trilinear), mps_ext's kernels vs torch's own MPS op, on an Apple-silicon Mac.

Reports microseconds, effective bandwidth (one read of the input and one write of the output), its share of
the chip's peak, and the speedup. Usage: python benchmarks/bench_upsample.py [--dtype bf16 fp32]
"""

import argparse
import sys

import torch
import torch.nn.functional as F

from _common import TIMING, Column, compare, main, peak_gbps

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# (label, shape, size, mode, channels_last): the 2x nearest-exact upsampling of Qwen-Image's and Wan's VAE
# decoders (frames as the batch), a UNet's 2x nearest, a feature pyramid's bilinear, an image resize's bicubic,
# a video model's trilinear.
CASES = [("vae decoder", (1, 384, 256, 256), (512, 512), "nearest-exact", False),
         ("vae decoder", (4, 256, 128, 128), (256, 256), "nearest-exact", True),
         ("unet up", (1, 640, 64, 64), (128, 128), "nearest", False),
         ("feature pyramid", (8, 256, 128, 128), (256, 256), "bilinear", False),
         ("image resize", (4, 3, 1024, 1024), (768, 768), "bicubic", False),
         ("video", (1, 64, 16, 64, 64), (32, 128, 128), "trilinear", False)]

TITLE = "interpolation as image and video pipelines call it"
COLUMNS = [Column("case", "case", "", 16), Column("mode", "mode", "", 13), Column("layout", "layout", "", 6),
           Column("dtype", "dtype", "", 5), *TIMING]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=list(DTYPES), nargs="+", default=["bf16", "fp32"])
    return p


def rows(args, chip):
    peak = peak_gbps(chip)
    for label, shape, size, mode, channels_last in CASES:
        for dname in args.dtype:
            x = torch.randn(shape, device="mps", dtype=DTYPES[dname])
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            out = F.interpolate(x, size=size, mode=mode)

            def run(x=x, size=size, mode=mode):
                return F.interpolate(x, size=size, mode=mode)

            layout = "NHWC" if channels_last else "NCHW"
            yield compare(f"{label} {mode} {layout} {dname}", run, run,
                          moved=(x.numel() + out.numel()) * x.element_size(), peak=peak, case=label, mode=mode,
                          layout=layout, dtype=dname)
            del x, out
            torch.mps.empty_cache()


if __name__ == "__main__":
    main(sys.modules[__name__])
