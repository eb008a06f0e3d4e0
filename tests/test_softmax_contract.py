"""softmax / log_softmax as torch sees them: fake (meta) kernels for tracing and torch.compile, the
opcheck contract, Python argument errors as torch raises them, and inputs at any address."""

import numpy as np
import pytest
import torch

import mps_ext
from tolerances import assert_close

OPS = {"softmax": (mps_ext.softmax, torch.softmax, torch.ops.mps_ext.softmax),
       "log_softmax": (mps_ext.log_softmax, torch.log_softmax, torch.ops.mps_ext.log_softmax)}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape, dim, dtype", [((3, 50), -1, None), ((2, 3, 40), 1, None), ((4, 7), 0, None),
                                                ((5, 300), -1, torch.float32), ((), 0, None), ((0, 5), 1, None)])
def test_meta_tensors(op, shape, dim, dtype):
    ours, theirs, _ = OPS[op]
    x = torch.empty(shape, device="meta", dtype=torch.float16 if dtype else torch.float32)
    got = ours(x, dim, dtype=dtype)
    want = theirs(x, dim, dtype=dtype)
    assert got.device.type == "meta" and got.shape == want.shape and got.dtype == want.dtype


@pytest.mark.parametrize("op", OPS)
def test_meta_dim_out_of_range_is_an_index_error(op):
    with pytest.raises(IndexError, match="[Dd]imension out of range"):
        OPS[op][0](torch.empty(3, 4, device="meta"), 2)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("args", [(torch.randn(3, 50), -1, None), (torch.randn(2, 300, 3), 1, None),
                                  (torch.randn(4, 7, dtype=torch.float16), 0, torch.float32),
                                  (torch.randn(2, 5000, dtype=torch.bfloat16), -1, None),
                                  (torch.randn(3, 4, dtype=torch.float64), 1, None)])
def test_opcheck(op, args, request):
    x, dim, dtype = args
    if x.dtype == torch.float64:
        request.applymarker(pytest.mark.fallback("dtype Double"))
    torch.library.opcheck(OPS[op][2], (x.requires_grad_(x.is_floating_point()), dim, dtype))


def test_torch_compile_fullgraph_traces_the_ops():
    torch._dynamo.reset()

    def f(x):
        return mps_ext.softmax(x * 2, -1) + mps_ext.log_softmax(x, 0, dtype=torch.float32)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 40)
    with mps_ext.trace() as t:
        got = compiled(x)
    assert_close(got, torch.softmax(x * 2, -1) + torch.log_softmax(x, 0))
    assert sorted(t.names) == ["log_softmax_simd_float_float", "softmax_simd_float_float"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("call, match", [
    (lambda f: f(torch.randn(3), 1.5), "dim"),
    (lambda f: f(torch.randn(3), "0"), "dim"),
    (lambda f: f(torch.randn(3), True), "dim"),
    (lambda f: f(torch.randn(3), 0, dtype="float32"), "dtype"),
    (lambda f: f(torch.randn(3), 0, dtype=1), "dtype"),
    (lambda f: f([1.0, 2.0], 0), "input"),
    (lambda f: f(np.ones(3, dtype=np.float32), 0), "input"),
])
def test_argument_types_are_type_errors(op, call, match):
    ours, theirs, _ = OPS[op]
    with pytest.raises(TypeError, match=match):
        call(ours)
    with pytest.raises(TypeError):
        call(theirs)  # what torch itself raises


@pytest.mark.fallback("dtype Double")  # dtype=float asks for float64
@pytest.mark.parametrize("op", OPS)
def test_numpy_integer_dim_and_python_dtype_are_accepted(op):
    x = torch.randn(3, 40)
    assert_close(OPS[op][0](x, np.int64(1)), OPS[op][1](x, 1))
    assert OPS[op][0](x, 1, dtype=float).dtype == OPS[op][1](x, 1, dtype=float).dtype == torch.float64


def misaligned(n: int, offset: int = 1) -> torch.Tensor:
    """n float32 values whose data pointer is `offset` elements past a 16-byte boundary (storage offset 0)."""
    base = np.arange(n + 8, dtype=np.float32) * 0.37 % 5
    start = (-(base.ctypes.data // 4) + offset) % 4
    t = torch.from_numpy(base[start:start + n])
    assert t.data_ptr() % 16 == offset * 4 and t.storage_offset() == 0
    return t


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape, kernel", [((16,), "simd"), ((4, 256), "block"), ((2, 5000), "finalize")])
def test_input_not_aligned_for_four_wide_loads(op, shape, kernel):
    ours, theirs, _ = OPS[op]
    n = int(np.prod(shape))
    x = misaligned(n).view(shape)
    with mps_ext.trace() as t:
        got = ours(x, -1)
    assert_close(got, theirs(x.clone(), -1), scale=4)
    assert any(kernel in name for name in t.names), t.names
    with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
        got = theirs(x, -1)
    assert_close(got, theirs(x.clone(), -1), scale=4)
    assert t.names and all(kernel in name or "partials" in name for name in t.names)


@pytest.mark.parametrize("op", OPS)
def test_storage_offset_not_a_multiple_of_four_at_an_aligned_address(op):
    ours, theirs, _ = OPS[op]
    x = misaligned(3 + 4 * 256, offset=1)[3:].view(-1, 256)  # storage offset 3, address 16-byte aligned
    assert x.data_ptr() % 16 == 0 and x.storage_offset() == 3
    with mps_ext.trace() as t:
        got = ours(x, -1)
    assert_close(got, theirs(x.clone(), -1), scale=4)
    assert t.names == [f"{op}_block_float_float"]
