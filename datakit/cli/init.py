"""`datakit init NAME`: a ready pipeline written into a folder of the user's, to run from an installed package.

Why: the ready pipelines (`pipelines/*.yaml`) read the repository's `demo/logs` and write `demo/out`,
paths relative to their own folder; found in a review of the installed wheel, a user of the package
had no way to get them at all. `init` writes the shipped file with those paths made relative to the
folder it is written into (`logs/`, `out/NAME`), so `datakit synth logs` and `datakit run NAME.yaml`
work there as `make demo` does in a checkout. Comments and everything else stay as shipped.
"""
from __future__ import annotations

from pathlib import Path

from datakit import resources

# the synth arguments of the repository-level pipelines, which need repository projects
_WITH_REPOSITORIES = "--events 3000 --repositories 40"
# the shipped files' paths, relative to the repository's pipelines/ folder -> relative to the written file;
# then their comments' checkout commands -> the commands for the written file
_REPLACEMENTS = (('"../demo/logs/', '"logs/'), ('"../demo/out/', '"out/'),
                 ("python -m datakit.cli.demo  (makes demo/logs, with repository projects)",
                  f"datakit synth logs {_WITH_REPOSITORIES}"),
                 ("python -m datakit.cli.demo  (makes demo/logs)", f"datakit synth logs {_WITH_REPOSITORIES}"),
                 ("datakit synth demo/logs", "datakit synth logs"), ("datakit run pipelines/", "datakit run "))
# the synth command each ready pipeline wants
SYNTH_ARGS = {"longctx": _WITH_REPOSITORIES, "feedback": _WITH_REPOSITORIES}
DEFAULT_SYNTH_ARGS = "--events 3000"  # as the shipped files' comments say


class InitError(ValueError):
    """A usage error of `datakit init`: one line, exit 2."""


def summaries() -> dict[str, str]:
    """Each shipped pipeline's name and the first line of its leading comment (what it makes)."""
    out = {}
    for name in resources.pipeline_names():
        lines = [ln.lstrip("# ").strip() for ln in starter_text(name).splitlines() if ln.startswith("#")]
        out[name] = lines[0] if lines else ""
    return out


def starter_text(name: str) -> str:
    """The shipped pipeline `name`, its input, opt-out list and output relative to the folder it is written to."""
    known = resources.pipeline_names()
    if name not in known:  # a name, never a path (`../x` would read beside the package's folder)
        raise InitError(f"no ready pipeline {name!r}; known: {', '.join(known)}")
    text = resources.pipeline_text(name)
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    if "../" in text:  # a shipped file this function does not know how to move: say so, never write it half-moved
        raise InitError(f"ready pipeline {name!r} names a path outside its folder that init cannot move")
    return text


def write_starter(name: str, folder: Path, force: bool = False) -> Path:
    """Write `folder/NAME.yaml` (refusing to replace a file unless `force`); its path."""
    text = starter_text(name)
    dest = folder / f"{name}.yaml"
    if dest.exists() and not force:
        raise InitError(f"{dest} exists; pass --force to replace it")
    if folder.exists() and not folder.is_dir():
        raise InitError(f"{folder}: is a file; give a folder to write the pipeline into")
    folder.mkdir(parents=True, exist_ok=True)
    dest.write_text(text, encoding="utf-8")
    return dest
