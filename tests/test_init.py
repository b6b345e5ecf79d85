"""`datakit init NAME`: the ready pipelines for a user of the installed package.

Found in a review of the installed wheel: `pipelines/*.yaml` were not in the package, and nothing told a
user of it how to get them; `python -m datakit.cli.demo` from the wheel said "no pipeline file".
"""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from datakit import Pipeline, resources
from datakit.cli import app
from datakit.cli.init import starter_text

ROOT = Path(__file__).resolve().parents[1]


def test_every_ready_pipeline_ships_in_the_package():
    assert resources.pipeline_names() == sorted(p.stem for p in (ROOT / "pipelines").glob("*.yaml"))
    assert resources.pipeline_text("quickstart") == (ROOT / "pipelines" / "quickstart.yaml").read_text()


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "pipelines").glob("*.yaml")))
def test_each_written_pipeline_reads_and_writes_beside_itself(name, tmp_path):
    r = CliRunner().invoke(app, ["init", name, "--dir", str(tmp_path / "job")])
    assert r.exit_code == 0, r.output
    dest = tmp_path / "job" / f"{name}.yaml"
    text = dest.read_text()
    assert "../" not in text and "demo/" not in text and "pipelines/" not in text
    cfg = Pipeline.from_yaml(dest).config
    assert cfg.input.path[0].startswith("logs/dt=*") if isinstance(cfg.input.path, list) else \
        str(cfg.input.path).startswith("logs/dt=*")
    assert cfg.output.path == f"out/{name}"
    # everything but those paths (and the comments naming checkout commands) is the shipped file
    shipped = [ln for ln in (ROOT / "pipelines" / f"{name}.yaml").read_text().splitlines() if "demo/" not in ln
               and "pipelines/" not in ln]
    assert [ln for ln in text.splitlines() if ln in shipped] == shipped


def test_a_written_pipeline_runs_where_it_was_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(app, ["init", "fim"]).exit_code == 0
    assert runner.invoke(app, ["synth", "logs", "--events", "300"]).exit_code == 0
    r = runner.invoke(app, ["run", "fim.yaml", "--quiet", "--no-report", "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "fim" / "_SUCCESS").exists()


def test_list_refusals_and_force(tmp_path):
    runner = CliRunner()
    listed = runner.invoke(app, ["init"])
    assert listed.exit_code == 0 and listed.stdout.splitlines()[0].startswith("code ")
    assert len(listed.stdout.splitlines()) == len(resources.pipeline_names())
    r = runner.invoke(app, ["init", "nope", "--dir", str(tmp_path)])
    assert r.exit_code == 2 and "no ready pipeline 'nope'; known: code, feedback" in r.stderr
    assert runner.invoke(app, ["init", "sft", "--dir", str(tmp_path)]).exit_code == 0
    (tmp_path / "sft.yaml").write_text("mine")
    r = runner.invoke(app, ["init", "sft", "--dir", str(tmp_path)])
    assert r.exit_code == 2 and "exists; pass --force" in r.stderr and (tmp_path / "sft.yaml").read_text() == "mine"
    assert runner.invoke(app, ["init", "sft", "--dir", str(tmp_path), "--force"]).exit_code == 0
    assert (tmp_path / "sft.yaml").read_text() == starter_text("sft")
    (tmp_path / "file").write_text("x")
    r = runner.invoke(app, ["init", "sft", "--dir", str(tmp_path / "file")])
    assert r.exit_code == 2 and "is a file" in r.stderr


def test_version_names_datakit_and_its_main_libraries():
    """Found in a review of the installed wheel: there was no `datakit --version` for a bug report."""
    from importlib import metadata

    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0
    line = r.stdout.strip()
    assert line.startswith("datakit ") and len(line.splitlines()) == 1
    assert f"pyarrow {metadata.version('pyarrow')}" in line and f"tokenizers {metadata.version('tokenizers')}" in line


def test_a_name_is_never_a_path_and_the_listing_names_no_checkout_folder(tmp_path):
    """Found in review: `datakit init ../x` read `x.yaml` beside the package's pipelines folder; the listing
    kept quickstart's "(datakit synth demo/logs)"."""
    runner = CliRunner()
    for bad in ("../x", "../pipelines/quickstart", "/etc/passwd", "quickstart.yaml"):
        r = runner.invoke(app, ["init", bad, "--dir", str(tmp_path)])
        assert r.exit_code == 2 and "no ready pipeline" in r.stderr, bad
    assert not list(tmp_path.iterdir())
    assert "demo/" not in runner.invoke(app, ["init"]).stdout
