"""The deployment examples are at least well-formed where no cluster can run them (Kubernetes, EMR):
the Dockerfile parses and copies files that exist, every shell script passes `bash -n`, the driver
script compiles, and docs/deploy.md names only files that exist."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
KNOWN = {"FROM", "ARG", "RUN", "COPY", "ENV", "USER", "WORKDIR", "ENTRYPOINT", "CMD", "LABEL", "EXPOSE", "ADD",
         "VOLUME", "SHELL", "HEALTHCHECK", "STOPSIGNAL", "ONBUILD"}


def test_k8s_dockerfile_parses_and_copies_what_exists():
    from dockerfile_parse import DockerfileParser

    df = DockerfileParser(path=str(EXAMPLES / "k8s" / "Dockerfile"))
    instr = [(i["instruction"], i["value"]) for i in df.structure if i["instruction"] != "COMMENT"]
    assert instr, "empty Dockerfile"
    assert {k for k, _ in instr} <= KNOWN, {k for k, _ in instr} - KNOWN
    first = [k for k, _ in instr if k != "ARG"][0]
    assert first == "FROM"
    assert df.baseimage, "FROM names no image"
    # the build context is examples/ (see the Dockerfile's header); dist/ is made by `python -m build`
    for k, v in instr:
        if k == "COPY":
            *sources, _dest = v.split()
            for src in sources:
                assert src.rstrip("/") == "dist" or (EXAMPLES / src).exists(), f"COPY {src}: not in examples/"
    env = dict(df.envs)
    assert env.get("PYSPARK_PYTHON", "").startswith("/opt/datakit-env/")
    # every RUN line is valid shell
    for k, v in instr:
        if k == "RUN":
            res = subprocess.run(["bash", "-n"], input=v, capture_output=True, text=True)
            assert res.returncode == 0, (v, res.stderr)


@pytest.mark.parametrize("script", sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.sh")))
def test_example_scripts_are_valid_bash(script):
    path = EXAMPLES / script
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text


def test_driver_script_compiles_and_k8s_submit_points_at_the_image_paths():
    compile((EXAMPLES / "spark_driver.py").read_text(), "spark_driver.py", "exec")
    submit = (EXAMPLES / "k8s" / "submit.sh").read_text()
    docker = (EXAMPLES / "k8s" / "Dockerfile").read_text()
    assert "local:///opt/datakit/spark_driver.py" in submit and "/opt/datakit/spark_driver.py" in docker
    assert "/opt/datakit-env/bin/python" in submit and "/opt/datakit-env" in docker


def test_deploy_doc_names_only_files_that_exist():
    doc = (ROOT / "docs" / "deploy.md").read_text()
    named = set(re.findall(r"`((?:examples|tests|docs)/[\w./-]+?\.(?:sh|py|md))", doc))
    named |= {"examples/k8s/Dockerfile"} if "examples/k8s/Dockerfile" in doc else set()
    assert named, "docs/deploy.md names no example or test"
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert missing == []
