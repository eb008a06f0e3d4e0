"""Autocast (``torch.autocast``) of the mps_ext:: operators: each casts its arguments as torch's autocast
casts the aten operator it stands for, on the device types where torch registers that operator for
autocast (``cpu``, ``mps``). Through the overrides torch's own autocast has cast an aten call before it
reaches mps_ext's kernels; this gives mps_ext's functions, called directly, the same dtypes.

The grouped and scaled matmuls, LU and triangular solves have no autocast in torch and get none here.
"""

from __future__ import annotations

import torch

from . import _C

_lib = torch.library.Library("mps_ext", "IMPL")  # holds the Autocast kernels

# torch's two casting policies that these operators meet (aten/src/ATen/autocast_mode.cpp): the region's
# lower-precision dtype, or float32.
LOWER = "lower_precision_fp"
FP32 = "fp32"

# mps_ext operator: (the aten operator it stands for, its policy per device type, the positions of the
# arguments cast). fp8_linear casts its input and bias, as a linear does; its FP8 weight and float32
# scales stay as they are.
RULES = {
    "linear": ("aten::linear", {"cpu": LOWER, "mps": LOWER}, (0, 1, 2)),
    "fp8_linear": ("aten::linear", {"cpu": LOWER, "mps": LOWER}, (0, 3)),
    "softmax": ("aten::softmax.int", {"mps": FP32}, (0,)),
    "log_softmax": ("aten::log_softmax.int", {"mps": FP32}, (0,)),
    "inv_ex": ("aten::linalg_inv_ex", {"cpu": FP32}, (0,)),
    "qr": ("aten::linalg_qr", {"cpu": FP32}, (0,)),
    "householder_product": ("aten::linalg_householder_product", {"cpu": FP32}, (0, 1)),
}


def _cast(value, device_type: str, dtype: torch.dtype):
    # torch's own cast (floating tensors of the region's device type, float64 left alone; a parameter's
    # lower-precision copy kept for the rest of the region).
    return _C._autocast_cast(value, dtype, device_type) if isinstance(value, torch.Tensor) else value


def _register(name: str, device_type: str, policy: str, positions: tuple[int, ...]) -> None:
    op = getattr(torch.ops.mps_ext, name).default
    key = getattr(torch._C.DispatchKey, "Autocast" + torch._C._dispatch_key_for_device(device_type))

    def autocast(*args, **kwargs):
        dtype = torch.get_autocast_dtype(device_type) if policy == LOWER else torch.float32
        args = [_cast(a, device_type, dtype) if i in positions else a for i, a in enumerate(args)]
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return op(*args, **kwargs)

    _lib.impl(name, autocast, key.name)


for _name, (_, _policies, _positions) in RULES.items():
    for _device_type, _policy in _policies.items():
        _register(_name, _device_type, _policy, _positions)
