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


def _pyspark_floor():
    import tomllib

    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    req = next(Requirement(r) for r in extras["spark"] if Requirement(r).name == "pyspark")
    (floor,) = [s.version for s in req.specifier if s.operator == ">="]
    return req.specifier, floor


def test_k8s_dockerfile_default_spark_meets_the_pyspark_floor():
    """Found in a docs review: the image defaulted to Spark 4.0.1 while the sink needs 4.1
    (`DataFrame.repartitionById`; pyproject's `spark` extra, docs/deploy.md)."""
    from packaging.version import Version

    docker = (EXAMPLES / "k8s" / "Dockerfile").read_text()
    m = re.search(r"^ARG SPARK_IMAGE=apache/spark:(\d+\.\d+\.\d+)-scala2\.13-java\d+-python3-ubuntu$", docker, re.M)
    assert m, "ARG SPARK_IMAGE is no apache/spark:X.Y.Z-scala2.13-javaN-python3-ubuntu tag"
    spec, floor = _pyspark_floor()
    assert Version(m.group(1)) in spec, (m.group(1), str(spec))
    # docs/deploy.md states the same floor as pyproject
    doc = (ROOT / "docs" / "deploy.md").read_text()
    stated = re.findall(r"Spark (\d+\.\d+) or newer", doc)
    assert stated and set(stated) == {floor}, (stated, floor)


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


def _spark_driver():
    import importlib.util

    spec = importlib.util.spec_from_file_location("spark_driver_example", EXAMPLES / "spark_driver.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_spark_driver_exits_as_datakit_run_with_one_line(tmp_path, monkeypatch, capsys):
    """Found in review: a busy output folder ended examples/spark_driver.py in a traceback and exit 1 ("a
    check failed"), where `datakit run` says one line and exits 3; so would a quality gate or storage error."""
    import pytest

    from datakit import Pipeline
    from datakit.io.publish import OutputBusyError
    from datakit.quality.expect import QualityGateError

    (tmp_path / "p.yaml").write_text("name: t\ninput: {path: in.jsonl}\nstages: [{kind: ingest}]\n"
                                     "output: {path: out}\n")
    driver = _spark_driver()
    for error, code in ((OutputBusyError("out is being written by another run"), 3),
                        (QualityGateError("a gate failed"), 1)):
        def fail(self, *a, _e=error, **k):
            raise _e

        monkeypatch.setattr(Pipeline, "run", fail)
        assert driver.main([str(tmp_path / "p.yaml")]) == code
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(error) in err
    monkeypatch.setattr(Pipeline, "run", lambda self, *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        driver.main([str(tmp_path / "p.yaml")])


def test_spark_submit_script_removes_its_driver_file_and_passes_the_exit_status_on(tmp_path):
    """Found in review: the script ended in `exec`, so its EXIT trap never removed the driver file it wrote
    (a /tmp/tmp.*.py per run). A stand-in spark-submit here exits 7, then is stopped by a SIGTERM."""
    import os
    import signal
    import subprocess
    import sys
    import time

    fake = tmp_path / "spark-submit"
    fake.write_text("#!/usr/bin/env bash\ntrap 'exit 143' TERM\nif [ \"$FAKE_MODE\" = wait ]; then "
                    "while true; do sleep 0.1; done; fi\nexit 7\n")
    fake.chmod(0o755)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "SPARK_SUBMIT": str(fake), "PYSPARK_PYTHON": sys.executable, "TMPDIR": str(tmpdir)}
    r = subprocess.run(["bash", str(EXAMPLES / "spark_submit.sh"), "p.yaml", "local[1]"], env=env, timeout=60)
    assert r.returncode == 7 and list(tmpdir.iterdir()) == []
    proc = subprocess.Popen(["bash", str(EXAMPLES / "spark_submit.sh"), "p.yaml", "local[1]"],
                            env={**env, "FAKE_MODE": "wait"})
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143 and list(tmpdir.iterdir()) == []
