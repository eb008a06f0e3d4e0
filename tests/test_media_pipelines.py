"""Image and video pipelines as their users run them: diffusers' own VAE classes (Qwen-Image's, Wan2.2's; tiny
configurations, random weights, nothing downloaded) round-trip a video whose frames hold 65,536 elements or more,
the size from which MPSGraph's 5-D padding corrupts its input on torch 2.13 and 2.14, as on the CPU; Wan's tiled
decode sends every F.pad to the kernels; and a UNet block of diffusers' (GroupNorm, SiLU, convolutions, dropout,
nearest upsampling) trains with the CPU's loss curve."""

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mps_ext
from tolerances import assert_close, reduction_scale

diffusers = pytest.importorskip("diffusers", reason='the pipelines need diffusers: pip install "mps_ext[media]"')

PADS_AND_INTERPOLATION = ("aten::constant_pad_nd", "aten::_upsample_nearest_exact2d")
# The smallest frame (H·W) from which torch 2.13's and 2.14's MPSGraph padding of a 5-D tensor writes the fill
# value over the input.
CORRUPTING_FRAME = 65536


class Calls(TorchDispatchMode):
    """The aten ops a model calls (by name, as the overrides' statistics name them), and the 5-D pads' inputs."""

    def __init__(self):
        super().__init__()
        self.count = collections.Counter()
        self.padded_5d = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = f"aten::{func.overloadpacket.__name__}"
        self.count[name] += 1
        if name == "aten::constant_pad_nd" and args[0].dim() == 5:
            self.padded_5d.append((tuple(args[0].shape), tuple(args[1])))
        return func(*args, **(kwargs or {}))


def vae(name):
    # Qwen-Image's VAE pads the frames of its causal 3-D convolutions; Wan2.2's (residual, patch size 2) also pads
    # one frame in front of each AvgDown3D, the pad that degraded Qwen-Image's image editing on a Mac.
    latents = {"latents_mean": [0.0] * 4, "latents_std": [1.0] * 4, "z_dim": 4, "num_res_blocks": 1}
    torch.manual_seed(0)
    if name == "qwen-image":
        return diffusers.AutoencoderKLQwenImage(base_dim=8, dim_mult=[1, 2, 2, 2], temperal_downsample=[True, False, False],
                                                **latents)
    return diffusers.AutoencoderKLWan(base_dim=16, dim_mult=[1, 2, 2], temperal_downsample=[True, False],
                                      is_residual=True, in_channels=12, out_channels=12, patch_size=2, **latents)


def assert_every_call_ran_the_kernels(calls: Calls, device):
    # The pads and interpolations one for one; the mid-block attention (one head over a frame's latent pixels)
    # in the attention kernels, none left to torch.
    stats = mps_ext.overrides.stats()
    for op in PADS_AND_INTERPOLATION:
        assert calls.count[op] > 0, (op, calls.count)
        assert stats[op]["hits"] == calls.count[op] and stats[op]["fallbacks"] == 0, (op, stats[op])
    attention = stats["aten::_scaled_dot_product_attention_math_for_mps" if device == "mps" else
                      "aten::scaled_dot_product_attention"]
    assert attention["hits"] > 0 and attention["fallbacks"] == 0, attention


def compare(got, want):
    # The pads and the interpolation are exact, but the attention kernels' float32 sums over a frame's latent
    # pixels (hundreds) round otherwise than torch's, which the decoder's convolutions carry on; on the GPU the
    # convolutions are MPS's too: within float32's tolerance for sums of that length.
    assert_close(got, want, scale=reduction_scale(torch.float32, 256))


@pytest.mark.parametrize("name, frame", [("qwen-image", (256, 256)), ("wan2.2", (512, 512))])
def test_a_vae_round_trip_past_the_frame_size_mpsgraph_corrupts_is_the_cpus(device, name, frame):
    model = vae(name).eval()
    x = torch.randn(1, 3, 5, *frame, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), Calls() as calls:
        want = model(x).sample
    # The pipeline does pad 5-D tensors past the threshold, one frame in front (Wan2.2: AvgDown3D's).
    big = [(shape, pad) for shape, pad in calls.padded_5d if shape[-1] * shape[-2] >= CORRUPTING_FRAME and any(pad)]
    assert big, calls.padded_5d
    if name == "wan2.2":
        assert any(pad == (0, 0, 0, 0, 1, 0) for _, pad in big), big
    model.to(device)
    mps_ext.overrides.reset_stats()
    with torch.no_grad(), mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        got = model(x.to(device)).sample.cpu()
    compare(got, want)
    assert_every_call_ran_the_kernels(calls, device)
    assert {"pad_constant_uint", "upsample_repeat_pairs_uint_2d"} <= set(t.names), set(t.names)
    assert any(n.startswith("attention_prefill_") for n in t.names), set(t.names)


def test_wans_tiled_decode_sends_every_pad_to_the_kernels(device):
    model = vae("wan2.2").eval()
    # Tiles of 64 pixels (8 latent pixels) overlapping by 16: a 32x32 latent (256x256 pixels) decodes as 6x6 tiles,
    # the last row and column 2 latent pixels wide, each padding before every causal convolution.
    model.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_stride_height=48,
                        tile_sample_stride_width=48)
    z = torch.randn(1, 4, 2, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), Calls() as calls:
        want = model.decode(z).sample
    model.to(device)
    mps_ext.overrides.reset_stats()
    with torch.no_grad(), mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        got = model.decode(z.to(device)).sample.cpu()
    # The tiles' mid-block attention: 64 query rows (8x8 latent pixels) in the prefill kernel, the corner
    # tile's 4 (2x2) in the decode kernel.
    assert {"attention_prefill_float_d32", "attention_decode_float_e2_r4"} <= set(t.names), set(t.names)
    compare(got, want)
    assert calls.count["aten::constant_pad_nd"] > 200, calls.count
    assert_every_call_ran_the_kernels(calls, device)


class UNetBlock(torch.nn.Module):
    """A UNet decoder stage of diffusers' own blocks: a ResNet block (GroupNorm, SiLU, 3x3 convolutions, dropout
    between them) and a 2x nearest upsampling with its convolution."""

    def __init__(self):
        super().__init__()
        from diffusers.models.resnet import ResnetBlock2D
        from diffusers.models.upsampling import Upsample2D

        self.resnet = ResnetBlock2D(in_channels=8, out_channels=8, temb_channels=None, groups=4, dropout=0.25)
        self.up = Upsample2D(8, use_conv=True)

    def forward(self, x):
        return self.up(self.resnet(x, None))


def test_a_unet_block_trains_with_the_cpus_loss_curve(device):
    # Dropout draws its own masks (the kernel's): the reference replays each step's mask (a forward hook on the block's
    # nn.Dropout) in float64, so the curves agree to float32's rounding.
    torch.manual_seed(3)
    model = UNetBlock()
    reference = UNetBlock().double()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 8, 12, 12, generator=torch.Generator().manual_seed(4))
    target = torch.randn(2, 8, 24, 24, generator=torch.Generator().manual_seed(5))
    masks = []
    model.resnet.dropout.register_forward_hook(lambda m, args, out: masks.append((out / args[0]).detach().cpu()))
    reference.resnet.dropout.register_forward_hook(lambda m, args, out: args[0] * masks.pop(0).double())
    model.to(device)
    mps_ext.overrides.reset_stats()
    losses = {"ours": [], "reference": []}
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(4):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x.to(device)), target.to(device))
            loss.backward()
            optimizer.step()
            losses["ours"].append(loss.item())
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    for _ in range(4):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(reference(x.double()), target.double())
        loss.backward()
        optimizer.step()
        losses["reference"].append(loss.item())
    assert not masks
    assert losses["ours"][-1] < losses["ours"][0]  # it trains
    assert_close(torch.tensor(losses["ours"]), torch.tensor(losses["reference"], dtype=torch.float32))
    stats = mps_ext.overrides.stats()
    assert stats["aten::upsample_nearest2d"]["hits"] == 4, stats
    assert stats["aten::upsample_nearest2d_backward (backward)"]["hits"] == 4, stats
    assert stats["aten::native_dropout"]["hits"] == 4, stats
    assert {"upsample_repeat_pairs_uint_2d", "upsample_backward_nearest_float_2d", "dropout_float",
            "dropout_backward_float"} <= set(t.names), set(t.names)
