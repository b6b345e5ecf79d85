"""`make demo` runs `python -m datakit.cli.demo` from the checkout.

Why this test: moving the demo module (into datakit/cli/) silently broke its checkout-root
computation and `make demo` exited 2 on a fresh clone; nothing else exercises that path.
"""
from __future__ import annotations

from pathlib import Path

from datakit import Pipeline
from datakit.cli import demo


def test_demo_root_is_the_checkout_and_its_pipeline_reads_what_the_demo_writes():
    repo = Path(__file__).resolve().parents[1]
    assert demo.ROOT == repo
    pipeline_file = demo.ROOT / "pipelines" / "quickstart.yaml"
    assert pipeline_file.is_file()
    pipeline = Pipeline.from_yaml(str(pipeline_file))
    # the demo synthesizes into ROOT/demo/logs: the pipeline's input and opt-out list must point there
    logs = (demo.ROOT / "demo" / "logs").resolve()
    input_path = Path(pipeline.base_dir, pipeline.config.input.path).resolve()
    assert str(input_path).startswith(str(logs) + "/"), input_path


def test_demo_refuses_a_missing_pipeline_with_exit_2(tmp_path, capsys):
    assert demo.main(["--pipeline", str(tmp_path / "nope.yaml")]) == 2
    assert "no pipeline file" in capsys.readouterr().err
