"""Runs INSIDE the mosaicml-streaming venv (requirements-mds.lock), never in the project's venv.

argv[1]: a JSON request {"dataset": OUT/data, "expect": .npz of samples per datakit shard,
"columns": {name: encoding}, "size_limit": int, "work": scratch dir, "result": .npz to write}.

1. Reads every sample of `dataset` with streaming's own `StreamingDataset` (index order) and
   batches it with torch's default collate (`DataLoader(batch_size=4)`).
2. Writes the expected samples of each datakit shard with streaming's own `MDSWriter` (same
   columns, same size_limit) and returns the bytes' sha256 and the index entries it wrote.
3. Runs the README's streaming snippet (request key "snippet") from "snippet_cwd".

`import streaming` loads its vision/multimodal example datasets, which import torchvision (PyPI's
build needs CUDA torch); they are stubbed: the MDS reader and writer do not use them.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import types

for _name in ("streaming.vision", "streaming.multimodal"):
    sys.modules[_name] = types.ModuleType(_name)

import numpy as np  # noqa: E402
from streaming import MDSWriter, StreamingDataset  # noqa: E402
from streaming.base.util import clean_stale_shared_memory  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402


def main() -> None:
    req = json.loads(sys.argv[1])
    clean_stale_shared_memory()
    result: dict[str, np.ndarray] = {}
    ds = StreamingDataset(local=req["dataset"], shuffle=False, batch_size=4)
    samples = [ds[i] for i in range(len(ds))]
    for name in req["columns"]:
        result[f"read/{name}"] = np.stack([s[name] for s in samples])
    batch = next(iter(DataLoader(ds, batch_size=4, num_workers=0)))
    result["batch_shapes"] = np.array([list(batch[n].shape) for n in sorted(req["columns"])])
    result["batch_labels_is_int64"] = np.array(str(batch["labels"].dtype) == "torch.int64")

    expect = np.load(req["expect"])
    shards = sorted({k.split("/")[0] for k in expect.files})
    index: dict[str, list] = {}
    for shard in shards:
        out = os.path.join(req["work"], shard)
        n = len(expect[f"{shard}/input_ids"])
        with MDSWriter(columns=req["columns"], out=out, size_limit=req["size_limit"]) as w:
            for i in range(n):
                w.write({name: expect[f"{shard}/{name}"][i] for name in req["columns"]})
        entries = json.load(open(os.path.join(out, "index.json")))["shards"]
        index[shard] = entries
        result[f"sha256/{shard}"] = np.array([
            hashlib.sha256(open(os.path.join(out, e["raw_data"]["basename"]), "rb").read()).hexdigest()
            for e in entries])
    result["index"] = np.array(json.dumps(index, sort_keys=True))

    if req.get("snippet"):  # the README's streaming block, as it is, from a folder whose out/mds is ours
        os.chdir(req["snippet_cwd"])
        names: dict = {"__name__": "readme_snippet"}
        exec(compile(req["snippet"], "README.md (streaming snippet)", "exec"), names)  # noqa: S102
        result["snippet_input_ids"] = names["batch"]["input_ids"].numpy()
        result["snippet_labels_dtype"] = np.array(str(names["batch"]["labels"].dtype))
    np.savez(req["result"], **result)


if __name__ == "__main__":
    main()
