"""The image and video cases of docs/performance.md (padding, interpolation, dropout): timed on a Mac by
bench_pad.py, bench_upsample.py and bench_dropout.py against torch's MPS ops, and on a CUDA GPU beside torch
CUDA's own kernels by tools/cuda_check/peers.py. Needs torch only, so that both import it.
"""

from __future__ import annotations

from _decode_cases import BF16, Case

# (label, shape, pad, mode): Wan2.2's causal 3-D convolutions (one frame before, per tile), Qwen-Image's
# AvgDown3D, a UNet's reflect-padded 3x3 convolutions, an audio model's 1-D reflect pad.
PAD = [("wan causal conv", (1, 96, 17, 480, 832), (1, 1, 1, 1, 2, 0), "constant"),
       ("wan frame", (1, 96, 17, 480, 832), (0, 0, 0, 0, 1, 0), "constant"),
       ("qwen-image AvgDown3D", (1, 192, 2, 256, 256), (0, 0, 0, 0, 1, 0), "constant"),
       ("unet 3x3", (1, 256, 128, 128), (1, 1, 1, 1), "reflect"),
       ("unet 3x3", (1, 256, 128, 128), (1, 1, 1, 1), "replicate"),
       ("audio", (8, 512, 16000), (256, 256), "reflect")]
# (label, shape, size, mode, channels_last): the 2x nearest-exact upsampling of Qwen-Image's and Wan's VAE
# decoders (frames as the batch), a UNet's 2x nearest, a feature pyramid's bilinear, an image resize's bicubic,
# a video model's trilinear.
UPSAMPLE = [("vae decoder", (1, 384, 256, 256), (512, 512), "nearest-exact", False),
            ("vae decoder", (4, 256, 128, 128), (256, 256), "nearest-exact", True),
            ("unet up", (1, 640, 64, 64), (128, 128), "nearest", False),
            ("feature pyramid", (8, 256, 128, 128), (256, 256), "bilinear", False),
            ("image resize", (4, 3, 1024, 1024), (768, 768), "bicubic", False),
            ("video", (1, 64, 16, 64, 64), (32, 128, 128), "trilinear", False)]
# (label, shape, p): a transformer's hidden states and attention-probability-sized activations, a UNet's
# feature map.
DROPOUT = [("llm hidden", (8, 2048, 4096), 0.1), ("vit tokens", (64, 197, 768), 0.1),
           ("unet features", (16, 320, 64, 64), 0.5)]
DROPOUT_CALLS = ("F.dropout", "backward")


def cases() -> list[Case]:
    """The proxy's rows of those tables, bf16 (as the pipelines run): dims pad (shape, pad, mode), upsample
    (shape, size, mode, channels_last), dropout (shape, p, call)."""
    out = [Case("pad", f"{label} {mode}", (shape, pad, mode), BF16) for label, shape, pad, mode in PAD]
    out += [Case("upsample", f"{label} {mode}{' NHWC' if cl else ''}", (shape, size, mode, cl), BF16)
            for label, shape, size, mode, cl in UPSAMPLE]
    out += [Case("dropout", f"{label} {call}", (shape, p, call), BF16) for label, shape, p in DROPOUT
            for call in DROPOUT_CALLS]
    return out
