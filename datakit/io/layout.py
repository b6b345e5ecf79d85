"""The output folder layout that standard readers open as it is (schemas/output_layout.md).

    OUT/README.md        dataset card; its `configs:` YAML names the data files for HF `datasets`
    OUT/manifest.json    the committed dataset (written last); `_SUCCESS` after it
    OUT/tokenizer.json   tokenized formats only
    OUT/data/...         the data files the manifest lists, and nothing else
    OUT/_*               side outputs: `_dropped/`, `_quarantine/`, `_shards/`, `_run.json`, `_ngram_index/`

Why a `data/` prefix: the folder root must hold the card and the manifest, which
pyarrow.dataset, polars.scan_parquet and duckdb would try to read as data; a
prefix that holds only the manifest's files is one path every reader takes
(`OUT/data`), and HF `datasets` is told the same files by the card. Why `_`
names for everything else: pyarrow, polars, Spark and our own `expand` skip
`_`/`.` names when they list a folder.
"""
from __future__ import annotations

import json
from typing import Any

from datakit.io.atomic import write_bytes_atomic
from datakit.io.fs import filesystem

DATA_PREFIX = "data"
CARD = "README.md"
TOKENIZER_FILE = "tokenizer.json"  # the effective tokenizer of tokenized outputs (manifest `tokenizer.file`)


def data_file(name: str) -> str:
    """The manifest path of a data file called `name` (relative to the output folder)."""
    return f"{DATA_PREFIX}/{name}"


def manifest_files(manifest: dict[str, Any]) -> list[str]:
    """Every data file the manifest lists, in shard order, then the dataset-level ones (MDS index.json)."""
    return [f for s in sorted(manifest.get("shards", []), key=lambda s: s["shard"]) for f in s["files"]] + \
        list((manifest.get("dataset_files") or {}).get("files", []))


def hf_configs(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The card's `configs:` entries: one `default` config, one `train` split, the exact file list.

    The files are listed one by one (not a glob) so a stale file in the folder
    can never add rows; only Parquet data has a config (packed/megatron arrays
    are read with datakit.loader / Megatron, not as a table). A packed or
    megatron output that holds preference pairs gets them as the `default` config.

    The config's `description` names the content (`content_digest`). Why: `datasets` caches what
    `load_dataset(folder)` read under the folder's base name and a hash of the card's configs,
    and nothing of the files themselves (not their times, not their sizes) - so a rerun into the
    same folder, or another dataset in a folder of the same name, was read from the cache of the
    first one: the old rows, silently (found: 86 new rows, 15,727 old ones returned). A
    `BuilderConfig` parameter that changes with the content gives each content its own cache entry.
    """
    files = manifest_files(manifest)
    if manifest.get("format") == "parquet":
        tables = [f for f in files if f.endswith(".parquet")]
    else:
        tables = [f for f in files if f.rsplit("/", 1)[-1].startswith("preference-")]
    if not tables:
        return []
    return [{"config_name": "default", "description": f"datakit dataset, content sha256 {content_digest(manifest, tables)}",
             "data_files": [{"split": "train", "path": tables}]}]


def content_digest(manifest: dict[str, Any], files: list[str]) -> str:
    """sha256 over `files` (manifest paths) and each one's own sha256 as the manifest records it.

    Equal for equal bytes under equal names, whatever folder the dataset is in, and different
    whenever any listed file's bytes differ (a file without a recorded sha256 - none is written
    so - counts with its byte size and row count instead, the most the manifest knows of it)."""
    import hashlib

    known: dict[str, str] = {}
    for s in [*manifest.get("shards", []), manifest.get("dataset_files") or {}]:
        for f in s.get("files", []):
            sha = (s.get("sha256") or {}).get(f)
            known[f] = sha if sha else f"bytes={(s.get('bytes') or {}).get(f)},rows={s.get('rows')}"
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f}\0{known.get(f, '')}\n".encode())
    return h.hexdigest()


def card_text(manifest: dict[str, Any]) -> str:
    """README.md: YAML front matter HF reads, then a short human description (no row content, so no PII).

    yaml is imported here, not at the top: this module is imported by every pool worker (the sinks),
    which never write a card, and PyYAML's import is ~0.05 CPU-s of each worker's start-up."""
    import yaml

    front: dict[str, Any] = {}
    configs = hf_configs(manifest)
    if configs:
        front["configs"] = configs
    front["tags"] = ["datakit", f"datakit-format-{manifest.get('format')}"]
    pipe = manifest.get("pipeline") or {}
    name = pipe.get("name", "datakit output")
    fmt = manifest.get("format")
    lines = ["---", yaml.safe_dump(front, sort_keys=False).rstrip(), "---", "",
             f"# {name}", "",
             f"Written by datakit: format `{fmt}`, {manifest.get('rows', 0)} rows in "
             f"{len(manifest.get('shards', []))} shard(s), pipeline hash `{manifest.get('pipeline_hash', '')}`."]
    snapshots = manifest.get("layout") == "snapshots"  # append mode: each snapshot has its own data/
    data = "PATH/_snapshots/*/data" if snapshots else "PATH/data"
    if snapshots:
        lines += ["", "Data files are under `_snapshots/<id>/data/`, one folder per snapshot (exactly the files",
                  "`manifest.json` lists); other names starting with `_` are side outputs (drop log, quarantine,",
                  "run report) that readers skip.", "", "```python"]
    else:
        lines += ["", "Data files are under `data/` (exactly the files `manifest.json` lists); names starting with `_`",
                  "are side outputs (drop log, quarantine, run report) that readers skip.", "", "```python"]
    if fmt == "parquet":
        lines += ["import datasets; ds = datasets.load_dataset(\"PATH\", split=\"train\")",
                  ("import glob, pyarrow.dataset as pads; "
                   f"t = pads.dataset(sorted(glob.glob(\"{data}/*.parquet\"))).to_table()"
                   if snapshots else f"import pyarrow.dataset as pads; t = pads.dataset(\"{data}\").to_table()"),
                  f"import polars as pl; df = pl.scan_parquet(\"{data}/*.parquet\").collect()",
                  f"import duckdb; duckdb.sql(\"SELECT count(*) FROM '{data}/*.parquet'\")"]
        if snapshots:
            lines.append("from datakit.io.dataset import read_output; t = read_output(\"PATH\")  # or snapshot=\"ID\"")
    elif fmt == "packed":
        lines += ["from datakit.loader import PackedDataset, collate",
                  "ds = PackedDataset(\"PATH\")  # see the README's 'Use the output' section"]
    elif fmt == "mds":
        lines += ["from streaming import StreamingDataset  # mosaicml-streaming",
                  "ds = StreamingDataset(local=\"PATH/data\", shuffle=False)  # input_ids, labels, loss_mask, position_ids"]
    else:
        lines += [f"# Megatron data prefixes: {json.dumps(manifest.get('data_prefixes', [])[:2])} ..."]
    lines += ["```", ""]
    return "\n".join(lines)


# The dataset card while a dataset is withdrawn: its `configs` name no file, so `datasets.load_dataset`
# finds no data instead of the files under data/ (being rewritten, or partly rewritten by a killed run).
RETRACTED_CARD = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: _retracted/no-data-*
tags:
- datakit
- datakit-retracted
---

# Being rewritten

A datakit run is rewriting this dataset, or was stopped while doing so: there is no committed dataset
here until its `manifest.json` is written again (rerun the pipeline).
"""


def write_card(out: str, manifest: dict[str, Any]) -> None:
    """Write OUT/README.md atomically (before the manifest: the manifest stays the last file written)."""
    write_bytes_atomic(f"{out.rstrip('/')}/{CARD}", card_text(manifest).encode())


def remove_root_file(out: str, name: str) -> bool:
    """Remove OUT/`name` if it is there (a root file the new manifest does not describe); True if removed.

    Why: a rerun into the same folder replaced the data and the manifest but left the earlier run's
    `tokenizer.json` when the new run wrote none (records, or tokenized Parquet before it named its
    tokenizer): a trainer decoding the new ids with it read garbage (found in review)."""
    fs, p = filesystem(f"{out.rstrip('/')}/{name}")
    if not fs.exists(p):
        return False
    fs.rm(p)
    return True


def prune_data(out: str, keep: list[str]) -> list[str]:
    """Remove files under OUT/data that the committed manifest does not list (a rerun with fewer shards).

    Why: readers pointed at OUT/data must see exactly the manifest's rows. Runs
    before the new manifest is written (the old one was retracted before the run
    rewrote anything), so a manifest never stands beside files it does not list.
    Returns the removed names.
    """
    fs, root = filesystem(f"{out.rstrip('/')}/{DATA_PREFIX}")
    if not fs.exists(root):
        return []
    keep_set = set(keep)
    removed = []
    for f in fs.find(root):
        rel = f"{DATA_PREFIX}/{f[len(root.rstrip('/')) + 1:]}"
        if rel not in keep_set:
            fs.rm(f)
            removed.append(rel)
    return removed
