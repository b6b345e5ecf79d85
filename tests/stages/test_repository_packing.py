"""`packing: repository`: a repository's files stay together, each after what it imports, on synth ground truth.

The synthetic projects (`generate(repositories=N)`) know every file's final
text and import edges; the packed output is decoded back through its segment
index and `repo_files` table and checked against them.
"""
from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from datakit import Pipeline
from datakit.loader import PackedDataset
from datakit.stages.tokenize.imports import Resolver, dependency_order, import_specs
from datakit.stages.tokenize.tokenizers import load_tokenizer
from datakit.synth import generate, read_ground_truth
from datakit.synth.corpus import shared_corpus
from datakit.synth.repos import build_repository

TOKENIZER = str(Path(__file__).resolve().parents[1] / "data" / "tokenizer")


def test_imports_resolve_to_the_planted_edges_in_every_language():
    corpus = shared_corpus(())
    langs = set()
    for k in range(60):
        repo = build_repository(random.Random(f"imports:{k}"), corpus, "org_t", k)
        langs.add(repo.language)
        paths = [f.path for f in repo.files]
        r = Resolver(paths)
        deps = {f.path: r.resolve(f.path, import_specs(f.path, f.text)) for f in repo.files}
        assert deps == {f.path: set(f.imports) for f in repo.files}, repo.language
        order = {p: i for i, p in enumerate(dependency_order(sorted(paths), deps))}
        assert all(order[d] < order[f.path] for f in repo.files for d in f.imports)  # every file after its imports
    assert langs == {"python", "typescript", "javascript", "go", "rust"}


def test_dependency_order_breaks_cycles_and_keeps_path_order_without_edges():
    assert dependency_order(["a", "b", "c"], {}) == ["a", "b", "c"]
    assert dependency_order(["a", "b", "c"], {"a": {"c"}, "b": {"a"}}) == ["c", "a", "b"]
    assert dependency_order(["a", "b", "c"], {"a": {"b"}, "b": {"a"}, "c": set()}) == ["c", "a", "b"]


def _run(logs: Path, out: Path, seq_len: int, shards: int, kinds=("code",)):
    return (Pipeline("longctx", seed=0).input(str(logs / "dt=*" / "*.jsonl.zst")).add({"kind": "ingest"})
            .add({"kind": "consent", "optouts": str(logs / "optouts.parquet")})
            .add({"kind": "extract", "kinds": list(kinds)})
            .add({"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": seq_len, "packing": "repository"})
            .output(str(out), format="packed", shards=shards)).run(workers=1)


def _files_of(out: Path) -> list[dict]:
    """Every packed file with its decoded text, rebuilt from segments (units may span sequences)."""
    m = json.loads((out / "manifest.json").read_text())
    tok = load_tokenizer(str(out / "tokenizer.json"))
    rows = []
    for s in m["shards"]:
        a = s["arrays"]
        tokens = np.load(out / a["tokens"], mmap_mode="r")
        segs, index = np.load(out / a["segments"]), np.load(out / a["seq_index"])
        unit_parts: dict[int, list] = defaultdict(list)
        for i in range(tokens.shape[0]):
            seq = segs[index[i]:index[i + 1]]
            ends = list(seq[1:, 0]) + [tokens.shape[1]]
            for (start, row, off), end in zip(seq.tolist(), ends):
                if row >= 0:
                    unit_parts[row].append((off, i, start, tokens[i, start:end]))
        units = {u: np.concatenate([p[3] for p in sorted(ps, key=lambda p: p[0])]) for u, ps in unit_parts.items()}
        for f in pq.read_table(out / a["repo_files"]).to_pylist():
            ids = units[f["doc_row"]][f["offset"]:f["offset"] + f["n_tokens"]]
            first = next(p for p in unit_parts[f["doc_row"]] if p[0] <= f["offset"] < p[0] + len(p[3]))
            assert (f["sequence"], f["position"]) == (first[1], first[2] + f["offset"] - first[0])
            rows.append({**f, "shard": s["shard"], "text": tok.decode(ids.tolist()), "first_id": int(ids[0])})
    return rows, m


@pytest.fixture(scope="module")
def projects(tmp_path_factory):
    logs = tmp_path_factory.mktemp("lc") / "logs"
    generate(logs, events=60, seed=4, days=1, repositories=8)
    return logs


def test_repository_files_are_whole_contiguous_and_in_import_order(projects, tmp_path):
    seq_len = 4096  # small enough that some projects need several sequences
    res = _run(projects, tmp_path / "out", seq_len, shards=2)
    files, m = _files_of(tmp_path / "out")
    sep = m["tokenizer"]["special_tokens"]["file_sep"]["id"]  # added to the tokenizer (it has none)
    assert "<file_sep>" in m["tokenizer"]["added_tokens"]
    truth = read_ground_truth(projects, "repo_file")
    by_repo: dict[str, list[dict]] = defaultdict(list)
    for f in files:
        by_repo[f["repo"]].append(f)
    split = 0
    for repo in read_ground_truth(projects, "repository"):
        group = f"{repo['repo_id']}@{repo['commit']}"
        mine = sorted(by_repo[group], key=lambda f: (f["doc_row"], f["offset"]))
        gt = {t["path"]: t for t in truth if t["repo_id"] == repo["repo_id"]}
        # exactly the project's files, each its newest version, behind its path header
        assert sorted(f["path"] for f in mine) == sorted(gt)
        assert len({f["shard"] for f in mine}) == 1
        for f in mine:
            assert f["first_id"] == sep
            head, _, body = f["text"].partition("\n")
            assert head.endswith(f["path"])
            assert hashlib.sha256(body.encode()).hexdigest() == gt[f["path"]]["sha256"], f["path"]
        # every file after the files it imports
        pos = {f["path"]: i for i, f in enumerate(mine)}
        assert all(pos[d] < pos[p] for p, t in gt.items() for d in t["imports"]), repo["repo_id"]
        # contiguous: the files of a unit tile it from offset 0, units of a repository are consecutive
        units = sorted({f["doc_row"] for f in mine})
        assert units == list(range(units[0], units[0] + len(units)))
        for u in units:
            inside = [f for f in mine if f["doc_row"] == u]
            assert [f["offset"] for f in inside] == list(np.cumsum([0] + [f["n_tokens"] for f in inside[:-1]]))
        total = sum(f["n_tokens"] for f in mine) + 1  # + EOS
        if total <= seq_len:
            assert len(units) == 1
        else:
            split += 1
    assert split >= 1, "no project was longer than seq_len: the test would not see a split"
    totals = m["totals"]
    assert totals["split_documents"] == 0 and totals["split_repositories"] == split
    tk = next(s for s in res.stages if s["name"] == "tokenize")
    assert tk["dropped"].get("older_version", 0) > 0 and tk["rows_in"] == tk["rows_out"] + sum(tk["dropped"].values())
    # the loader sees unit boundaries as document boundaries (attention never crosses repositories)
    ds = PackedDataset(str(tmp_path / "out"))
    s = ds[0]
    cu = s["cu_seqlens"][: int(s["num_segments"]) + 1]
    assert cu[0] == 0 and cu[-1] == seq_len
    assert (s["position_ids"][cu[:-1]] == 0).all()


def test_fill_at_32k_on_a_realistic_corpus(tmp_path):
    """Projects of 3..28 files (Python text from the stdlib, templated JS/TS/Go/Rust) plus the
    ordinary sessions' code windows (grouped by repository and commit), one shard."""
    logs = tmp_path / "logs"
    generate(logs, events=1000, seed=1, days=2, repositories=60)
    _run(logs, tmp_path / "out", 32768, shards=1)
    totals = json.loads((tmp_path / "out" / "manifest.json").read_text())["totals"]
    assert totals["split_documents"] == 0 and totals["split_repositories"] > 0
    assert totals["fill_rate"] >= 0.95, totals


def test_256k_sequences_hold_whole_repositories(projects, tmp_path):
    """At 256K every project fits one unit: one sequence carries whole repositories, none split.
    Other kinds ride along: fim records are units of their own, preference pairs go to Parquet."""
    _run(projects, tmp_path / "out", 262144, shards=1, kinds=("code", "fim", "preference"))
    files, m = _files_of(tmp_path / "out")
    assert m["totals"]["preference_pairs"] > 0 and (tmp_path / "out" / m["shards"][0]["preference_file"]).exists()
    docs = pq.read_table(tmp_path / "out" / m["shards"][0]["arrays"]["docs"]).to_pylist()
    assert {d["kind"] for d in docs} == {"repository", "fim"}
    assert m["seq_len"] == 262144 and m["totals"]["split_repositories"] == 0
    repos = read_ground_truth(projects, "repository")
    for repo in repos:
        mine = [f for f in files if f["repo"] == f"{repo['repo_id']}@{repo['commit']}"]
        assert len(mine) == len(repo["files"]) and len({f["doc_row"] for f in mine}) == 1
        assert len({f["sequence"] for f in mine}) == 1
    # the loader lists the files of a sequence where their headers start
    ds = PackedDataset(str(tmp_path / "out"))
    listed = [f for i in range(len(ds)) for f in ds.files(i)]
    assert sorted(f["doc_id"] for f in listed) == sorted(f["doc_id"] for f in files)
    sep = m["tokenizer"]["special_tokens"]["file_sep"]["id"]
    for i in range(len(ds)):
        ids = ds[i]["input_ids"]
        assert [f["position"] for f in ds.files(i)] == np.flatnonzero(ids == sep).tolist()


def test_the_file_separator_leaves_every_other_special_token_id_as_it_was():
    """Found in review: repository packing added `<file_sep>` among the chat markers, shifting system/tool/
    user by one, so a long-context dataset and an SFT dataset of one tokenizer disagreed on their ids."""
    from datakit.stages.tokenize.stage import TokenizeConfig

    plain = TokenizeConfig(tokenizer="datakit:demo-bpe", seq_len=256).load()
    repo = TokenizeConfig(tokenizer="datakit:demo-bpe", seq_len=256, packing="repository").load()
    assert "file_sep" in repo.special and "file_sep" not in plain.special
    assert {k: repo.special[k] for k in plain.special} == plain.special
    assert repo.special["file_sep"] == max(repo.special.values())


def test_the_eos_stays_with_the_last_file_and_add_bos_starts_each_repository():
    """Found in review: a last file that filled its unit (or was longer than seq_len) left the repository's EOS a
    unit of its own, best-fit packed into another repository's sequence (5 of 164 repositories ended without it);
    and `add_bos: true` put no BOS before a repository, the only documents without one."""
    import pyarrow as pa

    from datakit.stages.tokenize.repository import BOS_ROW, EOS_ROW, GROUP, IMPORTS, PATH, plan_units

    def table(lengths: list[int]) -> pa.Table:
        return pa.table({GROUP: ["r"] * len(lengths), PATH: [f"f{i}.py" for i in range(len(lengths))],
                         IMPORTS: [[] for _ in lengths], "n_tokens": pa.array(lengths, pa.int32())})

    for lengths in ([6, 10], [6, 4], [3, 25], [10]):  # the last file fills its unit; is longer; fills alone
        for bos in (False, True):
            units, _ = plan_units(table(lengths), 10, seed=0, bos=bos)
            assert all(u["files"] for u in units), (lengths, bos, units)  # no unit of a lone EOS or BOS
            assert units[-1]["entries"][-1][0] == EOS_ROW
            assert [e[0] for u in units for e in u["entries"]].count(EOS_ROW) == 1
            assert (units[0]["entries"][0][0] == BOS_ROW) == bos
            assert all(u["n_tokens"] <= 10 for u in units if u["files"] > 1)  # never split but alone

    units, _ = plan_units(table([6, 4]), 10, seed=0)  # 6 + 4 + EOS > 10: the last file moves, with its EOS
    assert [[e[0] for e in u["entries"]] for u in units] == [[0], [1, EOS_ROW]]


def test_add_bos_with_repository_packing_puts_bos_before_each_repository(projects, tmp_path):
    out = tmp_path / "out"
    (Pipeline("longctx", seed=0).input(str(projects / "dt=*" / "*.jsonl.zst")).add({"kind": "ingest"})
     .add({"kind": "extract", "kinds": ["code"]})
     .add({"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 4096, "packing": "repository", "add_bos": True,
           "special_tokens": {"bos": "<s>"}})
     .output(str(out), format="packed", shards=1)).run(workers=1)
    m = json.loads((out / "manifest.json").read_text())
    bos, sep = m["tokenizer"]["special_tokens"]["bos"]["id"], m["tokenizer"]["special_tokens"]["file_sep"]["id"]
    a = m["shards"][0]["arrays"]
    docs = pq.read_table(out / a["docs"]).to_pylist()
    tokens, masks = np.load(out / a["tokens"], mmap_mode="r"), np.load(out / a["loss_mask"], mmap_mode="r")
    segs, index = np.load(out / a["segments"]), np.load(out / a["seq_index"])
    first_ids: dict[int, tuple[int, int]] = {}
    for i in range(tokens.shape[0]):
        for start, row, off in segs[index[i]:index[i + 1]].tolist():
            if row >= 0 and off == 0:
                first_ids[row] = (int(tokens[i, start]), int(masks[i, start]))
    seen: set[str] = set()
    for u, d in enumerate(docs):
        if d["repo"] is None:
            assert first_ids[u] == (bos, 0), d  # a record outside a repository: the encoder's BOS
        elif d["repo"] not in seen:  # a repository's first unit
            seen.add(d["repo"])
            assert first_ids[u] == (bos, 0), d
        else:
            assert first_ids[u][0] == sep, d  # a later unit of the same repository goes on with a file
    assert seen
