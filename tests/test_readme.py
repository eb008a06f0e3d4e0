"""Every Python example of README.md runs as it is (on the simulator here), except those marked with a
`<!-- not run by tests/test_readme.py: reason -->` line, which must give a reason."""

import importlib.util
import re
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("line, code, skip", examples(), ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_readme_example_runs(line, code, skip):
    if skip:
        pytest.skip(f"README.md:{line}: {skip}")
    if "transformers" in code and importlib.util.find_spec("transformers") is None:
        pytest.skip('needs transformers: pip install "mps_ext[demo]"')
    p = run_python(code, timeout=300)
    assert p.returncode == 0, f"README.md:{line}:\n{p.stdout}\n{p.stderr}"
