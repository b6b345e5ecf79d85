"""Run Python code in a fresh interpreter: what a process imports or loads is only observable from the start."""
from __future__ import annotations

import subprocess
import sys


def fresh_python(code: str, env: dict[str, str] | None = None) -> str:
    """Stripped stdout of `python -c code` in a new interpreter; fails the test with its stderr if it fails."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()
