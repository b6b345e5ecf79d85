"""Data files datakit reads at run time, found inside the installed package.

Why `importlib.resources` and not paths relative to the source tree: a cluster
node has the installed wheel (or a packed environment), never the checkout, and
`Path(__file__).parent.parent / "schemas"` points outside `site-packages` there.
Every file read at run time lives under `datakit/` and is listed in
`pyproject.toml` package-data; the top-level `schemas/` and `quality/` folders
of the repository are symlinks into the package (one source of truth).

    datakit/schemas/NAME.json          data contracts (JSON Schema)
    datakit/quality/suites/NAME.json   great-expectations suites
    datakit/tokenizers/NAME.json       built-in tokenizers, used as `tokenizer: datakit:NAME`
    datakit/pipelines/NAME.yaml        the ready pipelines (`datakit init NAME` copies one out)

`datakit/pipelines` is the one link the other way round (a link to the repository's `pipelines/`):
those files name their inputs relative to their own folder (`../demo/logs`), which must stay the
repository's `demo/` for `make demo`; the wheel carries the files themselves.
"""
from __future__ import annotations

import json
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

BUILTIN_TOKENIZER_PREFIX = "datakit:"


def _folder(*parts: str) -> Traversable:
    node = resources.files("datakit")
    for p in parts:
        node = node / p
    return node


def _names(folder: Traversable, suffix: str = ".json") -> list[str]:
    """Stems of the `*.json` files in a package folder, sorted (for 'known: ...' messages)."""
    if not folder.is_dir():
        return []
    return sorted(f.name[: -len(suffix)] for f in folder.iterdir() if f.name.endswith(suffix))


def schema_names() -> list[str]:
    return _names(_folder("schemas"))


def schema_document(name: str) -> dict[str, Any]:
    """The JSON contract `NAME.json` shipped in `datakit/schemas/`."""
    f = _folder("schemas") / f"{name}.json"
    if not f.is_file():
        raise FileNotFoundError(f"no schema {name!r} in the datakit package; known: {schema_names()}")
    return json.loads(f.read_text(encoding="utf-8"))


def suite_names() -> list[str]:
    return _names(_folder("quality", "suites"))


def suite_document(name: str) -> dict[str, Any] | None:
    """A great-expectations suite shipped in `datakit/quality/suites/`, or None if there is none by that name."""
    f = _folder("quality", "suites") / f"{name}.json"
    if not f.is_file():
        return None
    return json.loads(f.read_text(encoding="utf-8"))


def tokenizer_names() -> list[str]:
    return _names(_folder("tokenizers"))


def builtin_tokenizer_bytes(name: str) -> bytes | None:
    """The bytes of a built-in tokenizer.json (`datakit:NAME`), or None when `name` is not of that form.

    Raises FileNotFoundError naming the known built-ins for an unknown `datakit:` name.
    """
    if not name.startswith(BUILTIN_TOKENIZER_PREFIX):
        return None
    stem = name[len(BUILTIN_TOKENIZER_PREFIX):]
    f = _folder("tokenizers") / f"{stem}.json"
    if not stem or "/" in stem or not f.is_file():
        known = ", ".join(BUILTIN_TOKENIZER_PREFIX + n for n in tokenizer_names())
        raise FileNotFoundError(f"no built-in tokenizer {name!r}; known: {known}")
    return f.read_bytes()


def pipeline_names() -> list[str]:
    """The ready pipelines shipped with the package (`datakit init NAME`)."""
    return _names(_folder("pipelines"), ".yaml")


def pipeline_text(name: str) -> str:
    """The shipped pipeline file `NAME.yaml`, as written in the repository's `pipelines/`."""
    f = _folder("pipelines") / f"{name}.yaml"
    if not f.is_file():
        raise KeyError(name)
    return f.read_text(encoding="utf-8")
