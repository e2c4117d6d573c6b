"""Every ```python block of README.md and docs/*.md runs (as a user would paste it)."""
import glob
import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def blocks():
    for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for k, m in enumerate(BLOCK.finditer(text)):
            yield pytest.param(m.group(1), id=f"{os.path.relpath(path, ROOT)}#{k}")


@pytest.mark.parametrize("code", list(blocks()))
def test_documented_python_runs(code, capsys):
    exec(compile(code, "<doc>", "exec"), {"__name__": "__doc_example__"})
