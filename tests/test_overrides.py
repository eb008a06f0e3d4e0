"""Enabling the overrides, as a user sees it in a fresh process."""

from conftest import run_python


def test_enabling_prints_no_warning_about_replacing_torch_kernels():
    p = run_python(
        "import torch, mps_ext\n"
        "mps_ext.overrides.enable('cpu')\n"
        "with mps_ext.trace() as t:\n"
        "    torch.softmax(torch.ones(3, 5), -1)\n"
        "print(t.names)\n")
    assert p.returncode == 0, p.stderr
    assert "softmax" in p.stdout  # the override is in place
    assert "Overriding a previously registered kernel" not in p.stderr, p.stderr
