"""Loading the NER model does not import torch, finds the same names, and leaves torch importable.

Each side runs in a fresh interpreter (what a pool worker is): one as datakit does it, one
where the user's process imported torch first (then nothing is blocked and thinc has torch).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from datakit.stages.scrub_pii.ner import installed_spacy_model

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(installed_spacy_model() is None, reason="no spaCy English pipeline installed")

SCRIPT = r"""
import json, sys
if sys.argv[1] == "user-torch-first":
    import torch
from datakit.stages.scrub_pii.ner import person_scanner
texts = []
for f in ("tests/data/pii_hard_cases.jsonl", "tests/data/pii_heldout/corpus.jsonl"):
    texts += [json.loads(l)["text"] for l in open(f, encoding="utf-8") if l.strip()]
from datakit.synth.plants import FIRST, LAST  # the synthetic logs' planted names, in chat-like prose
texts += [f"Thanks {a} {b}, I will ask {c} about the failing build before {d} reviews it."
          for a, b, c, d in zip(FIRST, LAST, FIRST[3:] + FIRST[:3], LAST[5:] + LAST[:5])]
found = person_scanner(required=True).names(texts)
torch_loaded = "torch" in sys.modules or "transformers" in sys.modules
import thinc.compat, torch, transformers  # a user's later imports still work in full
print(json.dumps({"findings": [[list(f) for f in fs] for fs in found], "torch_after_ner": torch_loaded,
                  "thinc_has_torch": thinc.compat.has_torch, "torch_ok": float(torch.ones(3).sum()) == 3.0,
                  "transformers_torch": transformers.is_torch_available()}))
"""


def _run(mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DATAKIT_SPACY_TORCH", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_ner_without_torch_finds_the_same_names_and_torch_still_imports():
    lean, full = _run("fresh"), _run("user-torch-first")
    assert lean["torch_after_ner"] is False  # the NER model ran without torch or transformers in the process
    assert full["torch_after_ner"] is True and full["thinc_has_torch"] is True  # not blocked when torch is in use
    assert sum(len(fs) for fs in lean["findings"]) > 30  # the corpus has names: this compares real findings
    assert lean["findings"] == full["findings"]
    assert lean["torch_ok"] and lean["transformers_torch"]  # a later `import torch`/transformers is complete
