"""softmax / log_softmax: mps_ext's kernels against torch on the CPU, the
override of aten::_softmax / aten::_log_softmax, and checked mode."""

import pytest
import torch

import mps_ext
from tolerances import assert_close, reduction_scale

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
OPS = {"softmax": (mps_ext.softmax, torch.softmax), "log_softmax": (mps_ext.log_softmax, torch.log_softmax)}


def check(op: str, x: torch.Tensor, dim: int, dtype=None, kernels=None, device="cpu"):
    """Runs mps_ext's op on `device`, checks it against torch's on the CPU and that the named kernels ran."""
    ours, theirs = OPS[op]
    with mps_ext.trace() as t:
        got = ours(x.to(device), dim, dtype=dtype).cpu()
    # The reference is torch's float32 result rounded once to the output
    # dtype: torch's own half log_softmax rounds intermediates and is further
    # from the exact value than the kernels.
    out_dtype = dtype or x.dtype
    x = x.cpu()
    want = theirs(x.to(dtype) if dtype else x, dim, dtype=torch.float32).to(out_dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    n = x.shape[dim] if x.dim() else 1
    assert_close(got, want, scale=reduction_scale(got.dtype, n, signed_terms=False))
    # The kernels ran, on the backend of the device (not a fallback to torch).
    assert t.kernels and all(k.backend == ("simulator" if device == "cpu" else "metal") for k in t.kernels)
    if kernels is not None:
        assert t.names == kernels
    return got


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [1, 7, 31, 33, 1000, 4097, 32000, 151936])
@pytest.mark.parametrize("rows", [1, 3, 8, 17])
@pytest.mark.parametrize("op", OPS)
def test_last_dim(device, op, rows, cols, dtype):
    x = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * cols)) * 3).to(dtype)
    t = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}[dtype]
    if cols <= 128:
        kernels = [f"{op}_simd_{t}_{t}"]
    elif cols <= 4096:
        kernels = [f"{op}_block_{t}_{t}"]
    else:
        kernels = [f"softmax_partials_{t}", f"{op}_finalize_{t}_{t}"]
    check(op, x, -1, kernels=kernels, device=device)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape,dim", [((4, 37, 300), 1), ((2, 3, 4, 512), 1), ((3, 1100), 0)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_other_dims_use_the_strided_kernel(device, op, shape, dim, dtype):
    # Enough columns (outer x inner >= 1024) to fill a GPU with one thread each.
    x = torch.randn(shape).to(dtype)
    t = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}[dtype]
    check(op, x, dim, kernels=[f"{op}_strided_{t}_{t}"], device=device)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape,dim,kernel", [((5, 7, 3), 1, "simd"), ((300, 33), 0, "block"),
                                              ((6000, 2), 0, "finalize")])
def test_other_dims_with_few_columns_move_the_dim_last(device, op, shape, dim, kernel):
    # A thread per column would leave the GPU idle: the last-dim kernels run on a transposed copy.
    x = torch.randn(shape)
    got = check(op, x, dim, device=device)
    assert got.is_contiguous()
    with mps_ext.trace() as t:
        OPS[op][0](x.to(device), dim)
    assert t.names[-1] == f"{op}_{kernel}_float_float"


@pytest.mark.parametrize("op", OPS)
def test_non_contiguous_inputs(device, op):
    base = torch.randn(40, 300, device=device)
    check(op, base.t(), -1, device=device)  # transposed
    check(op, base[:, 1:298:3], -1, device=device)  # strided slice
    check(op, base[3:], -1, device=device)
    check(op, base[:, 1:], -1, device=device)
    # Contiguous rows whose storage offset is not a multiple of 4: no 4-wide loads
    # (the simulator fails a misaligned vector load).
    check(op, torch.randn(1201, device=device)[1:].view(4, 300), -1, device=device)
    check(op, torch.randn(2 * 8192 + 2, device=device)[2:].view(2, 8192), -1, device=device)
    check(op, torch.randn(8, 6000, device=device)[:, 3:], -1, device=device)  # long rows, unaligned


@pytest.mark.parametrize("op", OPS)
def test_empty_and_scalar(device, op):
    ours, theirs = OPS[op]
    for shape, dim in [((0, 5), 1), ((5, 0), 1), ((0,), 0), ((3, 0, 2), 0)]:
        x = torch.randn(shape, device=device)
        with mps_ext.trace() as t:
            y = ours(x, dim)
        assert y.shape == x.shape and y.device == x.device and t.kernels == []
    x = torch.tensor(1.5)
    assert_close(ours(x.to(device), 0), theirs(x, 0))
    assert_close(ours(x.to(device), -1), theirs(x, -1))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("cols", [9, 100, 5000, 40000])
def test_nan_and_inf(device, op, cols):
    x = torch.randn(6, cols)
    x[0] = float("-inf")  # no mass: NaN everywhere
    x[1, cols // 2] = float("nan")  # NaN poisons its row
    x[2, 3] = float("inf")  # +inf: exp(inf - inf) is NaN, and so is the row's sum
    x[3, : cols // 2] = float("-inf")  # -inf entries have probability 0
    x[4, 1:] = float("-inf")  # one finite entry takes everything
    got = check(op, x, -1, device=device)
    assert got[0].isnan().all() and got[1].isnan().all() and got[2].isnan().all()
    if op == "softmax":
        assert got[3, : cols // 2].eq(0).all() and got[4, 0] == 1 and got[4, 1:].eq(0).all()
    got = check(op, x.t().contiguous(), 0, device=device)  # dim moved last
    assert got[:, 0].isnan().all() and got[:, 2].isnan().all()
    if cols <= 5000:  # the strided kernel: the same rows as 6 x 200 columns
        got = check(op, x.t().unsqueeze(-1).repeat(1, 1, 200), 0, device=device)
        assert got[:, 0].isnan().all() and got[:, 2].isnan().all() and not got[:, 5].isnan().any()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("cols", [100, 9000])
def test_dtype_argument(device, op, cols):
    x = torch.randn(4, cols)
    # half/bfloat16 in, float out: converted inside the kernel.
    for low, t in ((torch.float16, "half"), (torch.bfloat16, "bfloat")):
        with mps_ext.trace() as tr:
            check(op, x.to(low), -1, dtype=torch.float32, device=device)
        assert tr.names[-1].endswith(f"_{t}_float")
    # float in, half out: the input is cast first, as torch does.
    got = check(op, x, -1, dtype=torch.float16, device=device)
    assert got.dtype == torch.float16


@pytest.mark.fallback("dtype Double|dtype Long")
@pytest.mark.parametrize("op", OPS)
def test_unsupported_dtypes_behave_like_torch(op):
    ours, theirs = OPS[op]
    x = torch.randn(3, 5, dtype=torch.float64)
    with mps_ext.trace() as t:
        got = ours(x, 1)
    assert t.kernels == [] and torch.equal(got, theirs(x, 1))
    with pytest.raises(RuntimeError, match="not implemented for 'Long'"):  # torch's own error
        ours(torch.arange(6).view(2, 3), 1)
    with pytest.raises(IndexError, match="Dimension out of range"):
        ours(torch.randn(2, 3), 2)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gradients(device, op, dtype):
    ours, theirs = OPS[op]
    x = torch.randn(3, 50, dtype=dtype)
    w = torch.randn(3, 50)
    xd = x.to(device).requires_grad_()
    (ours(xd, 1, dtype=torch.float32) * w.to(device)).sum().backward()
    x.requires_grad_()
    (theirs(x, 1, dtype=torch.float32) * w).sum().backward()
    assert_close(xd.grad.cpu(), x.grad)


class TestOverrides:
    def test_torch_ops_run_the_kernels(self):
        x = torch.randn(4, 300)
        want_s, want_l = torch.softmax(x, -1), torch.nn.functional.log_softmax(x, dim=0)
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"):
            with mps_ext.trace() as t:
                got_s = torch.softmax(x, -1)
                got_l = torch.nn.functional.log_softmax(x, dim=0)
        assert t.names == ["softmax_block_float_float", "log_softmax_simd_float_float"]
        assert_close(got_s, want_s)
        assert_close(got_l, want_l)
        stats = mps_ext.overrides.stats()
        assert stats["aten::_softmax"]["hits"] == 1 and stats["aten::_log_softmax"]["hits"] == 1

    def test_gradients_flow_through_the_override(self):
        x = torch.randn(5, 6000, requires_grad=True)
        w = torch.randn(5, 6000)
        (torch.log_softmax(x, -1) * w).sum().backward()
        want = x.grad.clone()
        x.grad = None
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            (torch.log_softmax(x, -1) * w).sum().backward()
        assert "log_softmax_finalize_float_float" in t.names
        assert_close(x.grad, want, scale=reduction_scale(torch.float32, 6000, signed_terms=False))

    @pytest.mark.fallback("dtype Double")
    def test_fallbacks_are_counted(self):
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"):
            with mps_ext.trace() as t:
                y = torch.softmax(torch.randn(3, 4, dtype=torch.float64), -1)
        assert t.kernels == [] and y.dtype == torch.float64
        s = mps_ext.overrides.stats()["aten::_softmax"]
        assert s == {"hits": 0, "fallbacks": 1, "reasons": {"dtype Double": 1}}

    def test_disable_restores_torch(self):
        assert not mps_ext.overrides.is_enabled("cpu")
        with mps_ext.overrides.enabled("cpu"):
            assert mps_ext.overrides.is_enabled("cpu")
        assert not mps_ext.overrides.is_enabled("cpu")
        with mps_ext.trace() as t:
            torch.softmax(torch.randn(2, 3), -1)
        assert t.kernels == []
        mps_ext.overrides.enable("cpu")
        mps_ext.overrides.disable("cpu")
        with mps_ext.trace() as t:
            torch.softmax(torch.randn(2, 3), -1)
        assert t.kernels == []

    def test_mps_override_runs_the_metal_kernels(self, device):
        if device != "mps":
            pytest.skip("needs a usable MPS device")
        x = torch.randn(4, 300)
        with mps_ext.overrides.enabled("mps"), mps_ext.trace() as t:
            got = torch.softmax(x.to("mps"), -1)
        assert t.names == ["softmax_block_float_float"] and t.kernels[0].backend == "metal"
        assert_close(got.cpu(), torch.softmax(x, -1))

    def test_enabled_on_import_when_mps_is_available(self, monkeypatch):
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
        try:
            monkeypatch.setenv("MPS_EXT_DISABLE", "1")
            assert not mps_ext.overrides.enable_on_import() and not mps_ext.overrides.is_enabled("mps")
            monkeypatch.delenv("MPS_EXT_DISABLE")
            assert mps_ext.overrides.enable_on_import() and mps_ext.overrides.is_enabled("mps")
        finally:
            mps_ext.overrides.disable("mps")
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
        assert not mps_ext.overrides.enable_on_import()

    def test_unknown_device(self):
        with pytest.raises(ValueError, match="mps and cpu"):
            mps_ext.overrides.enable("meta")


@pytest.mark.parametrize("dtype", DTYPES)
def test_checked_mode_on_every_variant(dtype):
    x = torch.randn(3, 4100).to(dtype)
    with mps_ext.sim.checked():
        for op in OPS:
            check(op, x[:, :37], -1)  # simd, scalar loads
            check(op, torch.randn(37, 128).to(dtype), -1)  # simd, 4-wide loads, a partial threadgroup
            check(op, x[:, :401], -1)  # block, scalar loads
            check(op, x[:, :400].contiguous(), -1)  # block, 4-wide loads
            check(op, x, -1)  # partials + finalize
            check(op, x[:, :40].reshape(3, 5, 8), 1)  # dim moved last
            check(op, torch.randn(2, 9, 600).to(dtype), 1)  # strided
            if dtype != torch.float32:
                check(op, x[:, :40], -1, dtype=torch.float32)
