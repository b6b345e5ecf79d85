"""The README's "Use the output" code blocks, read from README.md itself (tests run them as they are)."""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

# the same stub as tests/mds_client.py: streaming's vision examples import torchvision (its PyPI build needs CUDA)
STREAMING_STUB = ("import sys, types\nfor _m in ('streaming.vision', 'streaming.multimodal'):\n"
                  "    sys.modules[_m] = types.ModuleType(_m)\n")


def use_the_output_snippets() -> list[str]:
    section = README.read_text().split("\n## Use the output\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def streaming_snippet() -> str:
    """The one block that needs mosaicml-streaming (tests/test_mds.py runs it in that venv)."""
    (block,) = [b for b in use_the_output_snippets() if "from streaming import" in b]
    return block
