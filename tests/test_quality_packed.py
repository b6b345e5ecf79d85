"""The packed suite's per-shard checks: pass on a real packed output, fail on each invariant broken on purpose."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from datakit import Pipeline
from datakit.quality.validate import validate_path
from tests.eventgen import make_event, write_jsonl

TOKENIZER = Path(__file__).resolve().parent / "data" / "tokenizer" / "tokenizer.json"


@pytest.fixture(scope="module")
def packed_out(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("packed")
    write_jsonl(root / "logs" / "a.jsonl", [make_event(i) for i in range(40)])
    out = root / "out"
    (Pipeline("p").input(str(root / "logs")).add({"kind": "ingest"})
     .add({"kind": "extract", "kinds": ["code", "fim", "sft"]})
     .add({"kind": "tokenize", "tokenizer": str(TOKENIZER), "seq_len": 64, "packing": "best_fit"})
     .output(str(out), format="packed", shards=2).run(workers=1))
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _results(path: Path, engine: str = "local", **kw) -> dict[str, dict]:
    res = validate_path(str(path), ["packed"], engine, **kw)
    return {r["type"]: r for r in res["results"]}


def _save(path: Path, arr: np.ndarray) -> None:
    np.save(path, arr)


ENGINES = ["local", pytest.param("spark", marks=pytest.mark.spark)]


@pytest.mark.parametrize("engine", ENGINES)
def test_packed_output_passes_and_each_broken_invariant_fails(request, packed_out, tmp_path, engine):
    opts = {"workers": 1}
    if engine == "spark":
        request.getfixturevalue("spark")
        opts = {"master": "local[2]"}
    good = _results(packed_out, engine, **opts)
    assert all(r["success"] for r in good.values()), good
    assert good["packed.ids_below_vocab"]["rows"] > 0 and good["packed.boundaries_monotonic"]["rows"] > 0

    m = json.loads((packed_out / "manifest.json").read_text())
    vocab = m["tokenizer"]["vocab_size"]
    breaks = {
        "packed.ids_below_vocab": lambda d: _poke(d, "tokens", lambda a: a.__setitem__((0, 3), vocab)),
        "packed.mask_binary": lambda d: _poke(d, "loss_mask", lambda a: a.__setitem__((1, 2), 2)),
        "packed.sequence_length": lambda d: _save(_arr(d, "tokens"), np.load(_arr(d, "tokens"))[:, :-1].copy()),
        "packed.boundaries_monotonic": lambda d: _poke(d, "segments", lambda a: a.__setitem__((1, 0), 0)
                                                       if a[1, 0] != 0 else a.__setitem__((1, 0), 70)),
        "packed.counts_match_manifest": lambda d: _edit_manifest(d),
    }
    for name, brk in breaks.items():
        d = _copy(packed_out, tmp_path / name)
        brk(d)
        got = _results(d, engine, **opts)
        assert [k for k, r in got.items() if not r["success"]] == [name], (name, got)
        assert got[name]["sample"].startswith(("shard", "totals"))


def _arr(d: Path, array: str) -> Path:
    """Shard 0's file of `array`, as the manifest names it (relative to the output folder)."""
    m = json.loads((d / "manifest.json").read_text())
    return d / m["shards"][0]["arrays"][array]


def _poke(d: Path, array: str, fn) -> None:
    """Change one value of shard 0's array (the first sequence with more than one segment for `segments`)."""
    path = _arr(d, array)
    a = np.load(path).copy()
    if array == "segments":
        idx = np.load(_arr(d, "seq_index"))
        seq = next(i for i in range(len(idx) - 1) if idx[i + 1] - idx[i] > 1)
        sub = a[idx[seq]:idx[seq] + 2]
        fn(sub)
        a[idx[seq]:idx[seq] + 2] = sub
    else:
        fn(a)
    _save(path, a)


def _edit_manifest(d: Path) -> None:
    m = json.loads((d / "manifest.json").read_text())
    m["shards"][1]["sequences"] += 1
    (d / "manifest.json").write_text(json.dumps(m))


def test_validate_picks_the_packed_suite_by_default(packed_out):
    res = validate_path(str(packed_out), workers=1)
    assert res["suites"] == ["packed"] and res["success"]
    kinds = {r["type"] for r in res["results"]}
    assert "expect_column_values_to_be_unique" in kinds and "packed.mask_binary" in kinds
