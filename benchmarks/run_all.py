"""Run every benchmark in this folder, one after another, each printing its own side-by-side table.

Benchmarks are measurements, not tests: they print throughput and accuracy next to
the reference library's, as ratios, and never fail on a number.
Usage: .venv/bin/python benchmarks/run_all.py [--only NAME ...]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", nargs="*", default=None, help="benchmark file stems to run (default: all)")
    args = ap.parse_args()
    scripts = sorted(p for p in HERE.glob("*.py") if p.name != "run_all.py" and not p.name.startswith("_"))
    if args.only:
        scripts = [p for p in scripts if p.stem in args.only]
    failed = []
    for script in scripts:
        print(f"\n===== {script.name} =====", flush=True)
        if subprocess.run([sys.executable, str(script)], cwd=HERE.parent).returncode != 0:
            failed.append(script.name)
    if failed:
        print(f"\nbenchmarks that crashed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
