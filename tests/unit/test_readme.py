"""The README's Python examples run as written (against the demo model that ships with onnxpy)."""

from __future__ import annotations

import re

from tests.helpers import REPO


def test_readme_python_blocks_run() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 3
    scope: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), scope)  # noqa: S102 - the README's own code
    assert scope["probabilities"].shape == (2, 10)
    assert scope["out"].shape == (2, 10)
