"""The eval registry read offline from a Hugging Face cache laid out as huggingface_hub writes it
(refs/main -> snapshots/<commit>/<config files> -> blobs), with the datasets' real file paths and fields."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from datakit.stages.decontaminate.check import check
from datakit.stages.decontaminate.registry import ENTRIES

COMMIT = "4bb6404fdc6cacfda99d4ac4205087b89d32030c"  # any 40-hex commit: the snapshot folder's name
ITEMS = [  # sanitized-MBPP rows: real field names, made-up problems
    {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 2,
     "prompt": "Write a function to interleave the digits of two numbers, most significant first.",
     "code": "def interleave_digits(first, second):\n    a, b = str(first), str(second)\n    out = []\n"
             "    for i in range(max(len(a), len(b))):\n        if i < len(a):\n            out.append(a[i])\n"
             "        if i < len(b):\n            out.append(b[i])\n    return int(''.join(out))\n",
     "test_imports": [], "test_list": ["assert interleave_digits(123, 45) == 14253", "assert interleave_digits(9, 87) == 987"]},
    {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 3,
     "prompt": "Write a function that returns the run lengths of equal adjacent characters of a string.",
     "code": "def run_lengths(text):\n    runs = []\n    for ch in text:\n        if runs and runs[-1][0] == ch:\n"
             "            runs[-1][1] += 1\n        else:\n            runs.append([ch, 1])\n"
             "    return [count for _, count in runs]\n",
     "test_imports": [], "test_list": ["assert run_lengths('aabccc') == [2, 1, 3]"]},
]


def _hub_cache(root, repo: str, rel: str, rows: list[dict], commit: str = COMMIT) -> None:
    """One dataset file in a Hub cache: the blob (JSON lines for a .jsonl name, else Parquet), the snapshot
    symlink to it, and refs/main -> `commit`."""
    base = root / f"datasets--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(commit)
    blob = base / "blobs" / f"blob-{abs(hash((rel, commit))):x}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    if rel.endswith(".jsonl"):
        blob.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), str(blob))
    link = base / "snapshots" / commit / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(blob)


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    cache = tmp_path / "hf"
    _hub_cache(cache, "google-research-datasets/mbpp", "sanitized/test-00000-of-00001.parquet", ITEMS)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _data(tmp_path, texts: list[str]) -> str:
    d = tmp_path / "data"
    d.mkdir()
    pq.write_table(pa.table({"doc_id": [f"d{i}" for i in range(len(texts))], "text": texts}), str(d / "p.parquet"))
    return str(d)


def test_registry_entries_name_dataset_fields_and_license():
    assert {"humaneval-plus", "mbpp", "mbpp-sanitized", "mbpp-plus", "ds1000", "apps", "codecontests",
            "bigcodebench", "cruxeval", "swebench-verified", "livecodebench-v1", "livecodebench-v6",
            "multipl-e-rs"} <= set(ENTRIES)
    swe = ENTRIES["swebench-verified"]
    assert swe.repo == "princeton-nlp/SWE-bench_Verified" and swe.fields == ("problem_statement", "patch")
    assert ENTRIES["livecodebench-v3"].files == ("test.jsonl", "test2.jsonl", "test3.jsonl")
    assert all(e.license and e.fields and e.id_field for e in ENTRIES.values())


def test_cached_eval_is_read_offline_with_its_own_fields(hub, tmp_path):
    leak = "# util.py\n" + ITEMS[0]["code"] + "\nprint(interleave_digits(1, 2))\n"
    res = check(_data(tmp_path, [leak, "x = 1\n"]), ["mbpp-sanitized"])
    ev = res.evals[0]
    assert ev.name == "mbpp-sanitized" and ev.items == 2 and ev.fields == ["prompt", "code", "test_list"]
    assert ev.source == f"hf://google-research-datasets/mbpp@{COMMIT}"
    assert [i.eval_id for i in ev.contaminated] == ["2"]


def test_evals_pull_and_list_cli(hub):
    from datakit.cli import app

    r = CliRunner().invoke(app, ["evals", "pull", "mbpp-sanitized"])
    assert r.exit_code == 0, r.output
    assert f"mbpp-sanitized: google-research-datasets/mbpp@{COMMIT} (1 file, license CC-BY-4.0)" in r.output
    r = CliRunner().invoke(app, ["evals", "list"])
    assert "mbpp-sanitized: google-research-datasets/mbpp" in r.output and f"[cached @{COMMIT[:12]}]" in r.output
    r = CliRunner().invoke(app, ["evals", "pull", "swebench-verified"])  # offline, not cached: one line, exit 2
    err = (r.stderr or r.output).strip()
    assert r.exit_code == 2 and len(err.splitlines()) == 1 and "not in the Hugging Face cache" in err


def test_uncached_eval_in_a_check_is_a_one_line_error(hub, tmp_path):
    from datakit.cli.contamination import _app

    r = CliRunner().invoke(_app(), ["--data", _data(tmp_path, ["x = 1\n"]), "--eval", "apps"])
    err = (r.stderr or r.output).strip()
    assert r.exit_code == 2 and len(err.splitlines()) == 1 and "datakit evals pull apps" in err


def test_name_equals_path_still_works(tmp_path):
    f = tmp_path / "private.jsonl"
    f.write_text("".join(json.dumps({"id": str(r["task_id"]), "code": r["code"]}) + "\n" for r in ITEMS))
    res = check(_data(tmp_path, [ITEMS[1]["code"]]), [f"mine={f}"])
    assert res.evals[0].name == "mine" and [i.eval_id for i in res.evals[0].contaminated] == ["3"]


def test_pull_records_the_commit_it_downloaded_and_checks_stay_on_it(hub, tmp_path, monkeypatch):
    """An entry without a pin: the cache's `main` moves (a later pull of another entry of the same
    repository, a copied cache): a check keeps reading the commit this eval was pulled at, and the report
    names it."""
    from datakit.stages.decontaminate import registry
    from datakit.stages.decontaminate.registry import pull, record_path

    unpinned = dict(registry.ENTRIES)
    unpinned["mbpp-sanitized"] = registry.HubEval(**{**ENTRIES["mbpp-sanitized"].__dict__, "revision": None})
    monkeypatch.setattr(registry, "ENTRIES", unpinned)
    (e, root, n), = pull(["mbpp-sanitized"])
    rec = json.loads(record_path("mbpp-sanitized").read_text())
    assert rec["commit"] == COMMIT == root.name and rec["pinned"] is None and rec["repo"] == e.repo
    assert rec["files"] == ["sanitized/test-00000-of-00001.parquet"]
    newer = "0123456789abcdef0123456789abcdef01234567"
    _hub_cache(hub, "google-research-datasets/mbpp", "sanitized/test-00000-of-00001.parquet", ITEMS[1:], newer)
    res = check(_data(tmp_path, [ITEMS[0]["code"]]), ["mbpp-sanitized"])
    assert res.evals[0].source == f"hf://google-research-datasets/mbpp@{COMMIT}" and res.evals[0].items == 2
    assert [i.eval_id for i in res.evals[0].contaminated] == ["2"]


def test_a_pinned_entry_is_pulled_at_its_pin_and_a_stale_pull_is_an_error(hub, tmp_path, monkeypatch):
    from datakit.stages.decontaminate import registry

    pin = ENTRIES["swebench-verified"].revision
    assert pin and len(pin) == 40
    rows = [{"instance_id": "astropy__astropy-1", "problem_statement": "Fix the frobnicator when the widget is "
             "empty and the flag is set to true for every item", "patch": "diff --git a/x.py b/x.py\n"}]
    _hub_cache(hub, "princeton-nlp/SWE-bench_Verified", "data/test-00000-of-00001.parquet", rows, pin)
    (_, root, _), = registry.pull(["swebench-verified"])
    assert root.name == pin and json.loads(registry.record_path("swebench-verified").read_text())["commit"] == pin
    assert check(_data(tmp_path, ["x = 1\n"]), ["swebench-verified"]).evals[0].source.endswith(f"@{pin}")
    moved = dict(registry.ENTRIES)
    moved["swebench-verified"] = registry.HubEval(**{**ENTRIES["swebench-verified"].__dict__, "revision": "f" * 40})
    monkeypatch.setattr(registry, "ENTRIES", moved)
    with pytest.raises(registry.EvalError, match="pulled at commit .* but the registry pins f{40}"):
        registry.load("swebench-verified")


def test_alternative_layouts_of_one_split_are_read_once(hub, tmp_path):
    """DS-1000's split as JSON lines or as Parquet: both present must not double every item (a doubled item's
    n-grams are all "shared by two items of one eval", i.e. ignored: the eval would be blind)."""
    pin = ENTRIES["ds1000"].revision
    rows = [{"prompt": "Problem:\nHow do I get the rolling median of a pandas Series with a window of three values "
             "and keep the index?\nA:\n<code>\nimport pandas as pd\n", "reference_code": "result = s.rolling(3)"
             ".median().reindex(s.index)\nresult = result.fillna(method='bfill').astype(float).round(decimals=2)\n",
             "metadata": {"problem_id": 7, "library": "Pandas"}}]
    _hub_cache(hub, "xlangai/DS-1000", "data/test-00000-of-00001.parquet", rows, pin)
    base = hub / "datasets--xlangai--DS-1000" / "snapshots" / pin
    (base / "test.jsonl").write_text(json.dumps(rows[0]) + "\n")
    res = check(_data(tmp_path, [rows[0]["reference_code"]]), ["ds1000"])
    assert res.evals[0].items == 1 and res.evals[0].contaminated_items == 1
    assert [i.eval_id for i in res.evals[0].contaminated] == ["7"]  # metadata's problem_id, not the dict's repr


def _lcb_item(k: int) -> dict:
    """A LiveCodeBench row: its real field names, a made-up problem long enough to be matched."""
    return {"question_id": f"q{k}", "question_content": f"Given an array of integers nums{k} and a target value t{k}, "
            f"return the length of the longest contiguous subarray whose sum of squares is divisible by {k + 3} and "
            f"whose first element is strictly larger than its last element, for test number {k}.",
            "starter_code": f"class Solution:\n    def longestSquareRun{k}(self, nums: List[int], t: int) -> int:\n"}


def _lcb_cache(hub, names: list[str]) -> str:
    """The pinned LiveCodeBench commit (shared by v1..v5) holding `names`, three items each; its pin."""
    pin = ENTRIES["livecodebench-v5"].revision
    for i, rel in enumerate(names):
        _hub_cache(hub, "livecodebench/code_generation_lite", rel, [_lcb_item(10 * i + j) for j in range(3)], pin)
    return pin


def test_an_entry_is_not_read_from_a_snapshot_pulled_for_another_entry(hub, tmp_path):
    """Found in review: livecodebench-v1..v5 share one pinned commit, each a different set of its files. After
    `evals pull livecodebench-v2` (test.jsonl, test2.jsonl), `evals list` called v1..v6 all cached and
    `--eval livecodebench-v5` exited 0 on v2's items, test3..test5.jsonl silently absent."""
    from datakit.cli import app
    from datakit.cli.contamination import _app

    pin = _lcb_cache(hub, ["test.jsonl", "test2.jsonl"])
    assert CliRunner().invoke(app, ["evals", "pull", "livecodebench-v2"]).exit_code == 0
    listed = {ln.split(":")[0]: ln for ln in CliRunner().invoke(app, ["evals", "list"]).output.splitlines()}
    assert listed["livecodebench-v1"].endswith(f"[cached @{pin[:12]}]")
    assert listed["livecodebench-v2"].endswith(f"[cached @{pin[:12]}]")
    assert "cached" not in listed["livecodebench-v5"]
    assert f"[incomplete @{pin[:12]}: no test3.jsonl, test4.jsonl, test5.jsonl" in listed["livecodebench-v5"]
    leak = _lcb_item(1)["question_content"]  # an item of test.jsonl: v5 would be contaminated, not clean
    r = CliRunner().invoke(_app(), ["--data", _data(tmp_path, [leak]), "--eval", "livecodebench-v5"])
    err = (r.stderr or r.output).strip()
    assert r.exit_code == 2 and len(err.splitlines()) == 1, r.output
    assert "test3.jsonl, test4.jsonl, test5.jsonl" in err and "run `datakit evals pull livecodebench-v5`" in err
    r = CliRunner().invoke(app, ["evals", "pull", "livecodebench-v5"])  # offline: the cache is all it has
    err = (r.stderr or r.output).strip()
    assert r.exit_code == 2 and len(err.splitlines()) == 1 and "HF_HUB_OFFLINE is set" in err, r.output
    assert not (hub / "datakit-evals" / "livecodebench-v5.json").exists()  # nothing recorded as pulled


def test_a_file_gone_from_a_pulled_snapshot_is_an_error_not_fewer_items(hub, tmp_path):
    """Found in review: with one file of a pulled snapshot gone (a pruned blob, a partly copied cache: its
    link dangles) the check read the rest, 9 items became 6 and a contaminated eval checked clean (exit 0),
    though the pull record lists the file. A shard that a glob pattern still matches through the others
    is caught by the record."""
    from datakit.cli.contamination import _app
    from datakit.stages.decontaminate import registry

    _lcb_cache(hub, ["test.jsonl", "test2.jsonl", "test3.jsonl"])
    registry.pull(["livecodebench-v3"])
    data = _data(tmp_path, [_lcb_item(21)["question_content"]])  # an item of test3.jsonl, verbatim
    r = CliRunner().invoke(_app(), ["--data", data, "--eval", "livecodebench-v3"])
    assert r.exit_code == 1, r.output
    snap = hub / "datasets--livecodebench--code_generation_lite" / "snapshots" / ENTRIES["livecodebench-v3"].revision
    (snap / "test3.jsonl").resolve().unlink()
    r = CliRunner().invoke(_app(), ["--data", data, "--eval", "livecodebench-v3"])
    err = (r.stderr or r.output).strip()
    assert r.exit_code == 2 and len(err.splitlines()) == 1, r.output
    assert "test3.jsonl not in the snapshot" in err and "run `datakit evals pull livecodebench-v3`" in err

    cc = ENTRIES["codecontests"]
    rows = [{"name": f"{k}_A. Problem {k}", "description": f"Print the sum of the {k} given integers.",
             "solutions": {"language": [3], "solution": ["print(sum(map(int, input().split())))\n"]}} for k in (1, 2)]
    for k, row in enumerate(rows):
        _hub_cache(hub, "deepmind/code_contests", f"data/test-0000{k}-of-00002.parquet", [row], cc.revision)
    registry.pull(["codecontests"])
    assert len(registry.load("codecontests").items) == 2
    snap = hub / "datasets--deepmind--code_contests" / "snapshots" / cc.revision
    (snap / "data" / "test-00001-of-00002.parquet").unlink()  # test-*.parquet still matches the other shard
    with pytest.raises(registry.EvalError, match=r"incomplete in the cache: data/test-00001-of-00002\.parquet not"):
        registry.load("codecontests")


def test_a_failed_download_says_so_once_and_never_asks_to_run_the_same_pull(tmp_path, monkeypatch, caplog):
    """Found in review: `datakit evals pull` with no network printed every retry warning twice (the
    library's own handler and ours) and ended telling the user to run `datakit evals pull` on a machine
    with network. The Hub here is a closed port on loopback (no network is touched) and the retries'
    sleeps are skipped."""
    import logging

    import huggingface_hub.constants as hc
    import huggingface_hub.utils._http as hub_http

    from datakit.stages.decontaminate.registry import EvalError, pull

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hc, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(hub_http.time, "sleep", lambda s: None)
    logging.getLogger("huggingface_hub").addHandler(logging.StreamHandler())  # as the library installs one
    with caplog.at_level(logging.WARNING), pytest.raises(EvalError) as err:
        pull(["mbpp-sanitized"])
    msg = str(err.value)
    assert "the download from the Hugging Face Hub failed (" in msg and "evals pull" not in msg, msg
    assert not [h for h in logging.getLogger("huggingface_hub").handlers if type(h) is logging.StreamHandler]
    assert any("Retrying" in r.getMessage() for r in caplog.records)  # the retries still reach our handlers


_SOLUTION = ("import sys\n\ndef main():\n    n = int(sys.stdin.readline())\n    values = list(map(int, sys.stdin.readline()"
             ".split()))\n    best = current = values[0]\n    for v in values[1:]:\n        current = max(v, current + v)\n"
             "        best = max(best, current)\n    print(best)\n\nmain()\n")


def test_solutions_stored_as_json_text_or_a_struct_are_matched_as_code(hub, tmp_path):
    """Found in review: APPS stores `solutions` as a JSON string and CodeContests as a struct of `language`
    and `solution` lists; both were matched as one escaped string literal, which has no n-gram of the code,
    so a verbatim leak of a solution checked clean."""
    statement = "Given a sequence of integers, print the largest sum of a contiguous non-empty subsequence of it."
    apps = ENTRIES["apps"]
    base = hub / "datasets--codeparrot--apps" / "snapshots" / apps.revision
    base.mkdir(parents=True)
    (hub / "datasets--codeparrot--apps" / "refs").mkdir()
    (hub / "datasets--codeparrot--apps" / "refs" / "main").write_text(apps.revision)
    (base / "test.jsonl").write_text(json.dumps({"problem_id": 4000, "question": statement,
                                                 "solutions": json.dumps([_SOLUTION]), "starter_code": ""}) + "\n")
    cc = ENTRIES["codecontests"]
    _hub_cache(hub, "deepmind/code_contests", "data/test-00000-of-00001.parquet",
               [{"name": "1575_A. Maximum subarray", "description": statement,
                 "solutions": {"language": [3], "solution": [_SOLUTION]}}], cc.revision)
    data = _data(tmp_path, ["# an unrelated file\nx = 1\n", _SOLUTION])
    res = check(data, ["apps", "codecontests"])
    assert [(e.name, e.items, e.contaminated_items) for e in res.evals] == [("apps", 1, 1), ("codecontests", 1, 1)]


def test_a_changed_eval_file_is_refused_and_listed_and_an_old_pin_is_not_listed_as_cached(hub, tmp_path, monkeypatch):
    """Found in review: only a file's presence was checked, so an edited or half-copied blob gave other items
    under the pinned name; `evals list` called a pull of an older pin "cached" although every check refuses it;
    and with both layouts of a `one_of` entry present, the first pattern's file was read although the pull had
    recorded the other."""
    from datakit.cli import app
    from datakit.stages.decontaminate import registry

    pin = _lcb_cache(hub, ["test.jsonl"])
    registry.pull(["livecodebench-v1"])
    assert len(registry.load("livecodebench-v1").items) == 3
    rec = json.loads(registry.record_path("livecodebench-v1").read_text())
    assert set(rec["sha256"]) == {"test.jsonl"} and len(rec["sha256"]["test.jsonl"]) == 64
    blob = (hub / "datasets--livecodebench--code_generation_lite" / "snapshots" / pin / "test.jsonl").resolve()
    blob.write_text(blob.read_text().splitlines(keepends=True)[0])  # two of three items gone, the name unchanged
    with pytest.raises(registry.EvalError, match=r"test\.jsonl in the snapshot .* is not the file `evals pull` "
                                                 r"downloaded .*run `datakit evals pull livecodebench-v1`"):
        registry.load("livecodebench-v1")
    listed = {ln.split(":")[0]: ln for ln in CliRunner().invoke(app, ["evals", "list"]).output.splitlines()}
    assert listed["livecodebench-v1"].endswith(f"[changed @{pin[:12]}: test.jsonl not as pulled; run "
                                               "`datakit evals pull livecodebench-v1`]")

    moved = dict(registry.ENTRIES)  # the registry moved its pin since that pull
    moved["livecodebench-v1"] = registry.HubEval(**{**ENTRIES["livecodebench-v1"].__dict__, "revision": "f" * 40})
    with monkeypatch.context() as m:
        m.setattr(registry, "ENTRIES", moved)
        listed = {ln.split(":")[0]: ln for ln in CliRunner().invoke(app, ["evals", "list"]).output.splitlines()}
    assert listed["livecodebench-v1"].endswith(f"[pulled @{pin[:12]}, not the pin; run `datakit evals pull "
                                               "livecodebench-v1`]")

    ds = ENTRIES["ds1000"]  # pulled as Parquet; a test.jsonl of other rows appears beside it later
    row = {"prompt": "Problem:\nHow do I get the rolling median of a pandas Series with a window of three values "
           "and keep the index?\nA:\n<code>\nimport pandas as pd\n", "reference_code": "result = s.rolling(3).median()"
           ".reindex(s.index)\n", "metadata": {"problem_id": 7, "library": "Pandas"}}
    _hub_cache(hub, "xlangai/DS-1000", "data/test-00000-of-00001.parquet", [row], ds.revision)
    registry.pull(["ds1000"])
    snap = hub / "datasets--xlangai--DS-1000" / "snapshots" / ds.revision
    (snap / "test.jsonl").write_text(json.dumps({**row, "metadata": {"problem_id": 99}}) + "\n")
    assert [i.id for i in registry.load("ds1000").items] == ["7"]


def test_a_pull_never_records_a_damaged_or_changed_file(hub, tmp_path):
    """Found in review: the check told the user to run `evals pull`, which did not download a file the cache held
    (huggingface_hub returns it) and recorded the edited file's sha256: the next check passed on it. A pull now
    judges the cached bytes by the Hub's own blob names (sha256, or the git blob id) and by this commit's last
    record, downloads again, and refuses (offline: names the file) rather than record them."""
    import hashlib

    from datakit.stages.decontaminate import registry

    pin = _lcb_cache(hub, ["test.jsonl"])
    registry.pull(["livecodebench-v1"])
    before = registry.record_path("livecodebench-v1").read_text()
    link = hub / "datasets--livecodebench--code_generation_lite" / "snapshots" / pin / "test.jsonl"
    link.resolve().write_text(link.read_text().splitlines(keepends=True)[0])
    with pytest.raises(registry.EvalError, match=r"test\.jsonl in the snapshot .* is not the file the Hub published; "
                                                 r"HF_HUB_OFFLINE is set"):
        registry.pull(["livecodebench-v1"])
    assert registry.record_path("livecodebench-v1").read_text() == before  # nothing blessed

    # a blob named as huggingface_hub names it (a small file: its git blob id), its bytes since changed
    good = link.read_bytes()
    blob = link.resolve().with_name(hashlib.sha1(b"blob %d\0" % len(good) + good).hexdigest())
    blob.write_bytes(good)
    link.unlink()
    link.symlink_to(blob)
    registry.record_path("livecodebench-v1").unlink()  # a cache copied without its record
    assert registry.damaged_blobs(link.parent, [link]) == []
    blob.write_bytes(good + b"\n")
    assert registry.damaged_blobs(link.parent, [link]) == ["test.jsonl"]
    with pytest.raises(registry.EvalError, match="is not the file `evals pull` downloaded"):
        registry.load("livecodebench-v1")  # no record to compare with: the blob's own name says it
    with pytest.raises(registry.EvalError, match="is not the file the Hub published"):
        registry.pull(["livecodebench-v1"])
