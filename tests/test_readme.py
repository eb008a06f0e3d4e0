"""Every Python example of README.md runs as it is (on the simulator here), except those marked with a
`<!-- not run by tests/test_readme.py: reason -->` line, which must give a reason; what a `print(...)  # output`
line promises is what it prints."""

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from conftest import run_python

README = Path(__file__).resolve().parent.parent / "README.md"
SKIP = re.compile(r"<!-- not run by tests/test_readme.py: (.+) -->")


def examples():
    """(first line number, code, skip reason or None) of every ```python block."""
    lines = README.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            end = lines.index("```", start)
            previous = next((line for line in reversed(lines[:i]) if line.strip()), "")
            skip = SKIP.fullmatch(previous.strip())
            found.append((start + 1, "\n".join(lines[start:end]), skip.group(1) if skip else None))
            i = end
        i += 1
    return found


def test_the_readme_has_examples_and_reasons_for_those_not_run():
    blocks = examples()
    assert len(blocks) >= 8
    for line, _, skip in blocks:
        assert skip is None or skip.strip(), f"README.md:{line}: a skipped example needs a reason"


def promised_outputs(code: str) -> list[str]:
    """What each ``print(...)  # text`` line of an example promises, comment lines that follow it joined on
    (whitespace collapsed); a printed line must begin the text (which may go on with a remark)."""
    promised, lines = [], code.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"print\(.*\)\s+# (.+)$", line)
        if not m:
            continue
        text = m.group(1)
        for more in lines[i + 1:]:
            if not re.match(r"\s+# ", more):
                break
            text += " " + more.strip()[2:]
        promised.append(" ".join(text.split()))
    return promised


def test_promised_outputs_are_read_from_the_examples():
    code = "x = 1\nprint(x)  # [1,\n          #  2]\nprint(2)\nprint(3)  # 3   (a remark)\n"
    assert promised_outputs(code) == ["[1, 2]", "3 (a remark)"]
    assert sum(len(promised_outputs(code)) for _, code, _ in examples()) >= 5


@pytest.mark.parametrize("line, code, skip", examples(), ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_readme_example_runs(line, code, skip):
    if skip:
        pytest.skip(f"README.md:{line}: {skip}")
    if "transformers" in code and importlib.util.find_spec("transformers") is None:
        pytest.skip('needs transformers: pip install "mps_ext[demo]"')
    p = run_python(code, timeout=300)
    assert p.returncode == 0, f"README.md:{line}:\n{p.stdout}\n{p.stderr}"
    if torch.backends.mps.is_available():
        return  # the promises are the simulator's output (kernel records say 'metal' on a Mac)
    printed = [" ".join(out.split()) for out in p.stdout.splitlines()]
    for promise in promised_outputs(code):
        assert any(out and promise.startswith(out) for out in printed), (
            f"README.md:{line}: promises {promise!r}; printed:\n{p.stdout}")
