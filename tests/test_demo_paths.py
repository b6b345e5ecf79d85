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


INGEST_ONLY = """\
name: demo-ingest
input: {path: "../demo/logs/dt=*/*.jsonl.zst", format: jsonl, schema: editor_event.v1}
stages:
  - {kind: ingest}
output: {path: "../demo/out/ingest", format: parquet}
"""


def test_installed_demo_writes_the_logs_where_its_pipeline_reads_them_never_into_the_package(tmp_path, monkeypatch,
                                                                                             capsys):
    """An installed package's demo (ROOT is then site-packages) with `--pipeline FILE`, as the README says.

    Found in a review of the installed wheel: the logs went to site-packages/demo/logs (a read-only
    install cannot take them) and the run, reading `../demo/logs` beside the pipeline file, stopped
    with a traceback ("no input files match")."""
    site = tmp_path / "venv" / "site-packages"
    site.mkdir(parents=True)
    monkeypatch.setattr(demo, "ROOT", site)
    job = tmp_path / "job"
    (job / "pipelines").mkdir(parents=True)
    (job / "pipelines" / "p.yaml").write_text(INGEST_ONLY)
    monkeypatch.chdir(job)
    rc = demo.main(["--pipeline", "pipelines/p.yaml", "--events", "30", "--repositories", "0", "--workers", "1"])
    assert rc == 0, capsys.readouterr().err
    assert list(site.iterdir()) == []
    assert (job / "demo" / "logs" / "optouts.parquet").is_file()
    assert (job / "demo" / "out" / "ingest" / "_SUCCESS").exists()


def test_demo_logs_folder_of_the_shipped_pipelines_is_the_checkouts_demo_logs():
    for name in ("quickstart", "longctx", "feedback"):
        pipeline = Pipeline.from_yaml(str(demo.ROOT / "pipelines" / f"{name}.yaml"))
        assert demo.logs_folder(pipeline) == (demo.ROOT / "demo" / "logs").resolve()


def test_demo_says_a_bad_pipeline_in_one_line_with_exit_2(tmp_path, capsys):
    bad = tmp_path / "p.yaml"
    bad.write_text(INGEST_ONLY.replace("{kind: ingest}", "{kind: ingest, bogus: 1}"))
    assert demo.main(["--pipeline", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "bogus" in err and "Traceback" not in err
