"""Import presidio and spaCy without torch (and transformers) when nothing here needs them.

Why: `presidio_analyzer` imports spaCy, whose `thinc.compat` imports torch if it is installed,
and presidio's Hugging Face recognizer imports transformers. The CNN spaCy pipelines we run
for person names (en_core_web_sm/md/lg) never touch torch, yet every process that loaded
them paid the import: measured in fresh processes (2 cores, under load; CPU seconds), importing
presidio took 4.2 s CPU and 505 MB peak RSS with torch and transformers, 0.8 s and 120 MB
without them. In a pool that is every worker.

How: while spaCy is first imported and a pipeline loaded (`ner.ner_pipeline`), or presidio is
imported (`presidio_bridge`), `sys.modules["torch"]` and `["transformers"]` are set
to None, so their imports raise ImportError and the libraries take their documented
"not installed" branches (thinc: `has_torch = False`; presidio: no Hugging Face recognizer).
Afterwards the entries are removed, so a user's own `import torch` / `import transformers`
later in the same process (e.g. the trainer loader) imports them normally and completely.

Not done when:
- torch or transformers is already imported (the process uses them anyway: nothing to save,
  and thinc then keeps its torch support);
- `spacy_transformers` is installed (a transformer pipeline, en_core_web_trf, runs on torch);
- `DATAKIT_SPACY_TORCH=1` is set (an escape hatch for a custom spaCy model built on thinc's
  PyTorch layers).
NER output is unchanged (tests/stages/test_pii_no_torch.py compares the findings).
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from typing import Iterator

BLOCKED = ("torch", "transformers")


def _needs_torch() -> bool:
    if os.environ.get("DATAKIT_SPACY_TORCH") == "1":
        return True
    try:
        return importlib.util.find_spec("spacy_transformers") is not None
    except (ImportError, ValueError):
        return False


@contextlib.contextmanager
def without_torch() -> Iterator[None]:
    """Inside the block, `import torch` / `import transformers` fail as if not installed (see module doc)."""
    if any(m in sys.modules for m in BLOCKED) or _needs_torch():
        yield
        return
    for m in BLOCKED:
        sys.modules[m] = None  # type: ignore[assignment]  # the import system's "not importable" marker
    try:
        yield
    finally:
        for m in BLOCKED:
            if sys.modules.get(m, 0) is None:
                del sys.modules[m]
