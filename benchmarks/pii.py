"""PII/secret scrubbing: precision/recall per entity type and MB/s, ours vs presidio, side by side.

Corpus (labeled, deterministic from --seed):
- real code: the Python standard library's own .py files, cut into ~4 KB
  documents (what an editor context window holds). Its natural PII (authors'
  emails in headers, example IPs in docs) was reviewed by hand; the labels are
  in tests/data/pii_hard_cases.stdlib_labels.json as sha256(value) -> entity
  (or null = not PII), so the file holds no PII itself.
- planted positives: generated values of every entity type, embedded in code
  lines (assignments, comments, config, calls) at random line boundaries.
- planted negatives: what looks like a secret but is not - git SHAs, sha256
  digests, UUIDs, version strings, OIDs, base64 blobs, ms timestamps.
- the hand-written hard cases (tests/data/pii_hard_cases.jsonl).

Scoring: a detection is a true positive when its span overlaps a labeled span
of the same entity class; ipv4/ipv6 form one class "ip". Unlabeled natural
detections count as false positives (the stdlib review covers every value
either tool flagged on the base text at the time of writing).

Timing: CPU seconds of this process (time.process_time), not wall time: the
machine is shared, and CPU time on one core (POLARS_MAX_THREADS=1) is what
"MB/s per core" means. Every timing, ours and presidio's, is the median of --repeat runs after one
untimed warm-up (like for like).

Systems, all on one core:
- ours/polars    the stage's scanner: Rust prefilter per detector + Python validators
- ours/python    every Python detector on every row (the reference path)
- presidio/plain presidio-analyzer's predefined recognizers, no_op NLP engine
                 (no spaCy model; a plain AnalyzerEngine() would try to download one),
                 offline tldextract; one analyze() per document
- presidio/tuned the same with a regex phone recognizer instead of libphonenumber

Person names in code contexts (`Author: ...`, copyright holders, "... by Name",
`TODO(name)`: the `person` pattern detector) are scored like every other class: the
planted names of author lines and the synth generator's `# TODO(Name):` comments,
and the stdlib's own author/credit names (reviewed like its e-mails; as for every
natural value, recall over them is pooled: a name no system found is not counted).
Person names in chat turns (NER, when a spaCy pipeline is installed) are measured
separately on chat text: the stage with `ner: off` vs `ner: auto` on the same chats.

Usage: .venv/bin/python benchmarks/pii.py [--mb 2] [--presidio-mb 1] [--seed 0] [--ner-mb 0.3] [--label-dump]
"""
from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py would shadow the stdlib `tokenize` (inspect imports it) when this
# script's folder is sys.path[0]; drop that entry before importing anything else.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
os.environ.setdefault("POLARS_MAX_THREADS", "1")  # one core, as the target says

import argparse  # noqa: E402
import base64  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import string  # noqa: E402
import sysconfig  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from datakit.stages.scrub_pii.detectors import IBAN_LENGTHS, luhn_ok  # noqa: E402
from datakit.stages.scrub_pii.scan import scan_batch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import comparison, timed, timed_alternated, write  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])  # the running interpreter's own standard library
HARD = ROOT / "tests" / "data" / "pii_hard_cases.jsonl"
LABELS = ROOT / "tests" / "data" / "pii_hard_cases.stdlib_labels.json"

# presidio entity -> our class (entities outside this map are "other" detections)
PRESIDIO_CLASS = {"EMAIL_ADDRESS": "email", "IP_ADDRESS": "ip", "PHONE_NUMBER": "phone",
                  "CREDIT_CARD": "credit_card", "IBAN_CODE": "iban", "US_SSN": "us_ssn"}
PII_CLASSES = ("email", "ip", "phone", "credit_card", "iban", "us_ssn", "home_dir_user", "person")


def cls(entity: str) -> str:
    return "ip" if entity in ("ipv4", "ipv6") else entity


def vhash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


# ------------------------------------------------------------------ generators of planted values

A = string.ascii_letters + string.digits


def pick(r: random.Random, alphabet: str, n: int) -> str:
    return "".join(r.choice(alphabet) for _ in range(n))


FIRST = ["anna", "jonas", "li", "maria", "omar", "priya", "sven", "tomasz", "yuki", "zoe", "kofi", "elena"]
LAST = ["schmidt", "nguyen", "garcia", "kowalski", "okafor", "tanaka", "silva", "berg", "haddad", "rossi"]
DOMAINS = ["acme-corp.com", "example-mail.org", "uni-freiburg.de", "startup.io", "bigbank.co.uk", "mail.fr"]


def g_email(r):
    sep = r.choice([".", "_", ""])
    return f"{r.choice(FIRST)}{sep}{r.choice(LAST)}{r.choice(['', str(r.randint(1, 99))])}@{r.choice(DOMAINS)}"


def g_ipv4(r):
    while True:
        a = r.choice([r.randint(11, 99), r.randint(101, 126), r.randint(128, 191), r.randint(193, 223), 10, 172, 192])
        ip = f"{a}.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(1, 254)}"
        if not ip.startswith(("192.0.2.", "198.51.100.", "203.0.113.", "169.254.")):
            return ip


def g_ipv6(r):
    groups = [f"{r.randint(0x2001, 0x2a0f):x}"] + [f"{r.randint(0, 0xffff):x}" for _ in range(7)]
    if groups[0] == "2001" and groups[1] == "db8":
        groups[1] = "4860"
    if r.random() < 0.5:
        return ":".join(groups)
    return ":".join(groups[:3]) + "::" + ":".join(groups[6:])


def g_phone(r):
    area, exch, sub = r.randint(201, 989), r.randint(200, 999), r.randint(0, 9999)
    return r.choice([f"({area}) {exch}-{sub:04d}", f"{area}-{exch}-{sub:04d}", f"+1 {area} {exch} {sub:04d}",
                     f"+44 20 {r.randint(7000, 8999)} {r.randint(0, 9999):04d}", f"+49 30 {r.randint(10000000, 99999999)}",
                     f"+33 1 {r.randint(10, 99)} {r.randint(10, 99)} {r.randint(10, 99)} {r.randint(10, 99)}"])


def g_card(r):
    prefix, n = r.choice([("4", 16), ("51", 16), ("55", 16), ("2221", 16), ("34", 15), ("37", 15), ("6011", 16)])
    body = prefix + pick(r, string.digits, n - len(prefix) - 1)
    check = next(d for d in "0123456789" if luhn_ok(body + d))
    num = body + check
    if n == 15:
        fmt = r.choice(["plain", "space"])
        return num if fmt == "plain" else f"{num[:4]} {num[4:10]} {num[10:]}"
    sep = r.choice(["", " ", "-"])
    return sep.join(num[i:i + 4] for i in range(0, 16, 4))


def g_iban(r):
    cc = r.choice(["DE", "GB", "FR", "NL", "ES", "IT"])
    n = IBAN_LENGTHS[cc]
    bban = (pick(r, string.ascii_uppercase, 4) + pick(r, string.digits, n - 8)) if cc in ("GB", "NL") else \
        pick(r, string.digits, n - 4)
    num = int("".join(str(int(c, 36)) for c in bban + cc + "00"))
    iban = f"{cc}{98 - num % 97:02d}{bban}"
    return " ".join(iban[i:i + 4] for i in range(0, len(iban), 4)) if r.random() < 0.5 else iban


def g_ssn(r):
    area = r.choice([r.randint(1, 665), r.randint(667, 899)])
    return f"{area:03d}-{r.randint(1, 99):02d}-{r.randint(1, 9999):04d}"


def g_b64(r, n, alphabet=A + "+/"):
    return pick(r, alphabet, n)


def g_jwt(r):
    enc = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")  # noqa: E731
    head = enc({"alg": "HS256", "typ": "JWT"})
    body = enc({"sub": str(r.randint(1, 10**9)), "name": r.choice(FIRST), "iat": r.randint(1.6e9, 1.8e9)})
    sig = base64.urlsafe_b64encode(r.randbytes(32)).decode().rstrip("=")
    return f"{head}.{body}.{sig}"


def g_pem(r):
    kind = r.choice(["RSA ", "EC ", "OPENSSH ", ""])
    lines = [g_b64(r, 64) for _ in range(r.randint(3, 8))]
    return f"-----BEGIN {kind}PRIVATE KEY-----\n" + "\n".join(lines) + f"\n-----END {kind}PRIVATE KEY-----"


def g_password(r):
    return pick(r, A, r.randint(4, 8)) + r.choice("!@#%&*_-") + pick(r, A, r.randint(3, 8))


# (entity, value generator, host-line templates: {v} is the value; the labeled span is exactly {v})
PLANTS = [
    ("email", g_email, ['# Author: {n} <{v}>', '    "maintainer": "{v}",', 'send_mail(to="{v}")',
                        '# questions? ask {v}', '__author__ = "{n} <{v}>"']),
    ("ipv4", g_ipv4, ['DB_HOST = "{v}"', '    server = ("{v}", 8080)', '# prod database lives at {v}',
                      'ssh_target = "deploy@{v}"', 'ALLOWED = ["{v}"]']),
    ("ipv6", g_ipv6, ['PEER = "{v}"', '# reachable at [{v}]:443', 'listen_addr = "{v}"']),
    ("phone", g_phone, ['# on-call: {v}', 'PHONE = "{v}"', '    "phone": "{v}",', 'call {v} if paged']),
    ("credit_card", g_card, ['card_number = "{v}"', '# test charge on {v}', '    "pan": "{v}",']),
    ("iban", g_iban, ['IBAN = "{v}"', '# refund to {v}', '    "iban": "{v}",']),
    ("us_ssn", g_ssn, ['ssn = "{v}"', '# employee SSN {v}']),
    ("home_dir_user", lambda r: r.choice(FIRST) + r.choice([".", "", "_"]) + r.choice(LAST),
     ['LOG = "/Users/{v}/projects/app/log.txt"', 'sys.path.insert(0, "/home/{v}/src")',
      'CACHE = r"C:\\Users\\{v}\\AppData\\Local\\cache"', '# File "/Users/{v}/dev/x.py", line 3']),
    ("url_credentials", lambda r: f"{r.choice(FIRST)}:{g_password(r).replace('@', 'x')}",
     ['DATABASE_URL = "postgres://{v}@db.internal:5432/app"', 'broker = "amqp://{v}@mq:5672//"',
      'REDIS = "redis://{v}@cache.local:6379/0"']),
    ("aws_access_key", lambda r: r.choice(["AKIA", "ASIA"]) + pick(r, string.ascii_uppercase + "234567", 16),
     ['AWS_ACCESS_KEY_ID = "{v}"', '    aws_access_key_id="{v}",', 'export AWS_ACCESS_KEY_ID={v}']),
    ("aws_secret_key", lambda r: g_b64(r, 40), ['aws_secret_access_key = "{v}"', 'AWS_SECRET_ACCESS_KEY={v}',
                                                '    aws_secret_access_key="{v}",']),
    ("github_token", lambda r: r.choice(["ghp_", "gho_", "ghs_"]) + pick(r, A, 36),
     ['GITHUB_TOKEN = "{v}"', 'headers = {{"Authorization": "token {v}"}}', 'git clone https://x:{v}@github.com/o/r']),
    ("gitlab_token", lambda r: "glpat-" + pick(r, A + "_-", 20), ['GITLAB_TOKEN = "{v}"', '# token {v}']),
    ("slack_token", lambda r: f"xoxb-{r.randint(10**9, 10**12)}-{r.randint(10**11, 10**13)}-{pick(r, A, 24)}",
     ['SLACK_BOT_TOKEN = "{v}"', 'client = WebClient(token="{v}")']),
    ("slack_webhook", lambda r: f"https://hooks.slack.com/services/T{pick(r, string.ascii_uppercase + string.digits, 8)}"
                                f"/B{pick(r, string.ascii_uppercase + string.digits, 10)}/{pick(r, A, 24)}",
     ['WEBHOOK = "{v}"', 'requests.post("{v}", json=msg)']),
    ("openai_key", lambda r: r.choice(["sk-proj-" + pick(r, A + "_-", 64), "sk-" + pick(r, A, 48)]),
     ['OPENAI_API_KEY = "{v}"', 'client = OpenAI(api_key="{v}")']),
    ("anthropic_key", lambda r: "sk-ant-api03-" + pick(r, A + "_-", 93) + "AA",
     ['ANTHROPIC_API_KEY = "{v}"', 'anthropic.Anthropic(api_key="{v}")']),
    ("google_api_key", lambda r: "AIza" + pick(r, A + "_-", 35), ['GOOGLE_API_KEY = "{v}"', 'url += "&key={v}"']),
    ("stripe_key", lambda r: r.choice(["sk_live_", "rk_live_", "sk_test_"]) + pick(r, A, 24),
     ['stripe.api_key = "{v}"', 'STRIPE_SECRET = "{v}"']),
    ("jwt", g_jwt, ['TOKEN = "{v}"', 'headers["Authorization"] = "Bearer {v}"', '# Authorization: Bearer {v}']),
    ("private_key", g_pem, ['KEY = """{v}"""', '{v}']),
    ("secret_assignment", g_password, ['DB_PASSWORD = "{v}"', '    password="{v}",', 'db_password: {v}',
                                       '"client_secret": "{v}",', 'SECRET_KEY = \'{v}\'', 'api_key = "{v}"']),
    ("high_entropy", lambda r: g_b64(r, r.randint(24, 48), A), ['SESSION_SIGNING = "{v}"', 'hmac_seed = "{v}"',
                                                                  'COOKIE_SIGNER = \'{v}\'']),
]

NEGATIVES = [
    lambda r: f'commit = "{r.randbytes(20).hex()}"',
    lambda r: f'expected_sha256 = "{r.randbytes(32).hex()}"',
    lambda r: f'request_id = "{uuid.UUID(int=r.getrandbits(128))}"',
    lambda r: f'RUN_ID = "{str(uuid.UUID(int=r.getrandbits(128))).upper()}"',
    lambda r: f'__version__ = "{r.randint(0, 30)}.{r.randint(0, 30)}.{r.randint(0, 30)}.{r.randint(0, 30)}"',
    lambda r: f'requires = ["pkg>={r.randint(1, 9)}.{r.randint(0, 20)}.{r.randint(0, 20)}.{r.randint(0, 9)}"]',
    lambda r: f'OID = "1.3.6.1.4.1.{r.randint(1, 99999)}.{r.randint(1, 99)}"',
    lambda r: f'ICON_PNG = "{g_b64(r, r.randint(120, 400))}"',
    lambda r: f'created_ms = {r.randint(1_500_000_000_000, 1_800_000_000_000)}',
    lambda r: f'etag = "{base64.b64encode(r.randbytes(18)).decode()}"',
    lambda r: f'# see https://github.com/python/cpython/commit/{r.randbytes(20).hex()}',
    lambda r: f'shape = ({r.randint(1, 4096)}, {r.randint(1, 4096)}, {r.randint(1, 4096)})',
    lambda r: f'password = os.environ["{r.choice(["DB_PASSWORD", "PGPASSWORD", "SECRET"])}"]',
    lambda r: f'token = self.next_token()  # {r.randint(0, 9)}',
    lambda r: f'timestamp = "2024-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}T{r.randint(0, 23):02d}:30:00Z"',
]


# ------------------------------------------------------------------ corpus

def base_docs(max_bytes: int) -> list[tuple[str, str]]:
    """(doc_id, text) chunks of ~4 KB at line boundaries from the stdlib, in a fixed order."""
    files = sorted(STDLIB.glob("*.py")) + sorted(STDLIB.glob("[a-z]*/*.py"))
    files = [f for f in files if "test" not in f.parts[-2] and "site-packages" not in str(f)]
    docs, total = [], 0
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        buf, n = [], 0
        for line in text.splitlines(keepends=True):
            buf.append(line)
            n += len(line)
            if n >= 4000:
                docs.append((f"{f.relative_to(STDLIB)}#{len(docs)}", "".join(buf)))
                total += len("".join(buf).encode())
                buf, n = [], 0
                if total >= max_bytes:
                    return docs
        if buf:
            docs.append((f"{f.relative_to(STDLIB)}#{len(docs)}", "".join(buf)))
            total += len("".join(buf).encode())
        if total >= max_bytes:
            break
    return docs


# the synth generator's entity names -> our classes (its PERSON plants, `# TODO(Name): ...` comments,
# are found by the `person` pattern detector; NER reads chat turns only)
SYNTH_CLASS = {"EMAIL": "email", "IP_ADDRESS": "ip", "PHONE": "phone", "AWS_ACCESS_KEY": "aws_access_key",
               "AWS_SECRET_KEY": "aws_secret_key", "GITHUB_TOKEN": "github_token", "SLACK_TOKEN": "slack_token",
               "OPENAI_KEY": "openai_key", "PRIVATE_KEY": "private_key", "JWT": "jwt",
               "PASSWORD": "secret_assignment", "HOME_PATH_USER": "home_dir_user", "PERSON": "person"}


def build_corpus(max_bytes: int, seed: int):
    """Texts, labeled spans (start, end, class) per text, synth-planted spans per text, reviewed natural labels.

    Plants come from two generators: this file's (every entity type, several host
    lines each) and `datakit.synth.plants.pii_snippet` (written separately for the
    synthetic editor logs, so it is an independent check on our patterns).
    """
    from datakit.synth.plants import pii_snippet

    r = random.Random(seed)
    natural = json.loads(LABELS.read_text()) if LABELS.exists() else {}
    texts, labels, synth_labels = [], [], []
    for _id, text in base_docs(max_bytes):
        lines = text.splitlines(keepends=True)
        # (line idx, inserted text, [(value, class, from_synth)])
        inserts: list[tuple[int, str, list[tuple[str, str, bool]]]] = []
        if r.random() < 0.35:
            for _ in range(r.randint(1, 3)):
                ent, gen, templates = r.choice(PLANTS)
                v = gen(r)
                tpl = r.choice(templates)
                name = f"{r.choice(FIRST).title()} {r.choice(LAST).title()}"  # same draws as before: same corpus
                vals = [(v, cls(ent), False)] + ([(name, "person", False)] if "{n}" in tpl else [])
                inserts.append((r.randint(0, len(lines)), tpl.replace("{n}", name).replace("{v}", v) + "\n", vals))
        if r.random() < 0.2:
            snippet, found = pii_snippet(r, r.choice(sorted(SYNTH_CLASS)), "python")
            inserts.append((r.randint(0, len(lines)), snippet, [(v, SYNTH_CLASS[e], True) for e, v in found]))
        if r.random() < 0.35:
            for _ in range(r.randint(1, 3)):
                inserts.append((r.randint(0, len(lines)), r.choice(NEGATIVES)(r) + "\n", []))
        # assemble in document order (stable for equal line indices) and record label offsets
        order = sorted(range(len(inserts)), key=lambda k: (inserts[k][0], k))
        out, spans, sspans, pos, k = [], [], [], 0, 0
        for li in range(len(lines) + 1):
            while k < len(order) and inserts[order[k]][0] == li:
                _idx, line, vals = inserts[order[k]]
                for v, c, from_synth in vals:
                    a = pos + line.index(v)
                    (sspans if from_synth else spans).append((a, a + len(v), c))
                out.append(line)
                pos += len(line)
                k += 1
            if li < len(lines):
                out.append(lines[li])
                pos += len(lines[li])
        new = "".join(out)
        texts.append(new)
        labels.append(spans + sspans)
        synth_labels.append(sspans)
    for line in HARD.read_text().splitlines():
        case = json.loads(line)
        t = case["text"]
        spans = []
        for e in case.get("expect_stage", case["expect"]):  # split-literal secrets: what the stage finds
            a = t.find(e["value"])
            spans.append((a, a + len(e["value"]), cls(e["entity"])))
        texts.append(t)
        labels.append(spans)
        synth_labels.append([])
    return texts, labels, synth_labels, natural


# ------------------------------------------------------------------ systems

def run_ours(texts, strategy, repeat=1):
    """Findings as (start, end, class) and the median CPU seconds of `repeat` runs after one warm-up."""
    found = []
    t = timed(lambda: found.append(scan_batch(texts, strategy=strategy)), runs=repeat, warmup=1, clock=time.process_time)
    return [[(f.start, f.end, cls(f.entity)) for f in fs] for fs in found[-1]], t


def stage_findings(texts):
    """What the stage finds (scanner + split string literals + overlap merge; NER off), as (start, end, class)."""
    import pyarrow as pa

    from datakit.stages.scrub_pii.stage import ScrubPiiConfig

    found = ScrubPiiConfig(ner="off").build_fn().scan(pa.array(texts, pa.string()))
    return [[(f.start, f.end, cls(f.entity)) for f in fs] for fs in found]


def stage_run(texts, rows_per_batch=1000):
    """One pass of the whole stage function (scan + replace + Arrow in/out) over code records, as a
    function to time (the records are built outside it)."""
    import pyarrow as pa

    from datakit.contracts import TRAINING_RECORD_V1
    from datakit.stages.scrub_pii.stage import ScrubPiiConfig

    recs = [{"doc_id": str(i), "kind": "code", "segments": [{"text": t, "train": True, "role": "code"}],
             "chosen": None, "rejected": None, "source": None, "meta": "{}"} for i, t in enumerate(texts)]
    batches = [pa.RecordBatch.from_pylist(recs[i:i + rows_per_batch], schema=TRAINING_RECORD_V1)
               for i in range(0, len(recs), rows_per_batch)]
    fn = ScrubPiiConfig(ner="off").build_fn()
    return lambda: [fn(b) for b in batches]


def run_stage(texts, repeat=1, rows_per_batch=1000):
    """The whole stage function over code records; median CPU seconds of `repeat` runs after one warm-up."""
    return timed(stage_run(texts, rows_per_batch), runs=repeat, warmup=1, clock=time.process_time)


def presidio_run(texts, analyzer, out: dict, key: str):
    """One pass of presidio over `texts` as a function to time; its findings land in out[key]."""
    def go():
        found = []
        for t in texts:
            res = analyzer.analyze(text=t, language="en")
            found.append([(x.start, x.end, PRESIDIO_CLASS.get(x.entity_type, "other:" + x.entity_type)) for x in res])
        out[key] = found
    return go


def chat_corpus(max_bytes: int, seed: int):
    """Two-turn chats (user, assistant) of real English prose with planted person names.

    The prose is the standard library's docstrings (natural language about code,
    like a chat about code); half the turns get a sentence naming a person from
    FIRST x LAST, and some assistant turns carry a fenced code block (names in
    code are out of NER's scope). Returns (records, planted names per record).
    """
    import ast

    r = random.Random(seed)
    paras: list[str] = []
    for f in sorted(STDLIB.glob("*.py")):
        try:
            tree = ast.parse(f.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 200:
                    paras.append(doc)
        if sum(map(len, paras)) > 4 * max_bytes:
            break
    recs, names, total, k = [], [], 0, 0
    while total < max_bytes and k + 2 < len(paras):
        turns, planted = [], []
        for role in ("user", "assistant"):
            text = paras[k][:1500]
            k += 1
            if r.random() < 0.5:
                name = f"{r.choice(FIRST).title()} {r.choice(LAST).title()}"
                text = r.choice([f"{name} asked me about this. ", f"Thanks, {name}! ",
                                 f"I talked to {name} yesterday and "]) + text
                planted.append(name)
            if role == "assistant" and r.random() < 0.5:
                text += "\n\n```python\ndef load_user_config(path):\n    return UserConfig.parse(path)\n```\n"
            turns.append({"text": text, "train": role == "assistant", "role": role})
            total += len(text.encode())
        recs.append({"doc_id": f"chat{len(recs)}", "kind": "sft", "segments": turns, "chosen": None,
                     "rejected": None, "source": None, "meta": "{}"})
        names.append(planted)
    return recs, names


def run_ner(max_bytes: int, seed: int, repeat: int) -> None:
    """Person-name NER's cost on chat text: the stage with `ner: off` vs `ner: auto`, same batches."""
    import pyarrow as pa

    from datakit.contracts import TRAINING_RECORD_V1
    from datakit.stages.scrub_pii.ner import installed_spacy_model, ner_pipeline
    from datakit.stages.scrub_pii.stage import ScrubPiiConfig

    model = installed_spacy_model()
    if model is None:
        print("\nperson-name NER: no spaCy English pipeline installed; skipped")
        return
    recs, names = chat_corpus(max_bytes, seed)
    nbytes = sum(len(s["text"].encode()) for rec in recs for s in rec["segments"])
    batches = [pa.RecordBatch.from_pylist(recs[i:i + 500], schema=TRAINING_RECORD_V1) for i in range(0, len(recs), 500)]
    t0 = time.process_time()
    ner_pipeline(model)  # what the stage loads per worker
    t_load = time.process_time() - t0
    timings, outs = {}, {}
    for ner in ("off", "auto"):
        fn = ScrubPiiConfig(ner=ner).build_fn()
        fn(batches[0].slice(0, 4))  # warm-up
        best = float("inf")
        for _ in range(repeat if ner == "off" else 1):
            t0 = time.process_time()
            outs[ner] = [fn(b) for b in batches]
            best = min(best, time.process_time() - t0)
        timings[ner] = best
    rows = [r for b in outs["auto"] for r in b.to_pylist()]
    found = sum(1 for rec, ns in zip(rows, names) for n in ns
                if n not in "\n".join(s["text"] for s in rec["segments"]))
    planted = sum(map(len, names))
    persons = sum(json.loads(m).get("pii.person", 0) for b in outs["auto"] for m in b.column("_metrics").to_pylist() if m)
    t_off, t_on = timings["off"], timings["auto"]
    print(f"\nperson-name NER ({model}, spaCy NER as presidio's SpacyRecognizer, ner pipe only) on chat text: "
          f"{len(recs)} two-turn chats, {nbytes / 1e6:.2f} MB (stdlib docstrings as prose)")
    print(f"  stage, ner: off   {nbytes / t_off / 1e6:8.2f} MB/s")
    print(f"  stage, ner: auto  {nbytes / t_on / 1e6:8.3f} MB/s   (NER alone ~{nbytes / max(t_on - t_off, 1e-9) / 1e6:.3f} MB/s; "
          f"{t_on / t_off:.0f}x the pattern-only time; model load {t_load:.1f} s once per process)")
    print(f"  planted names replaced: {found}/{planted} (recall {found / max(1, planted):.3f}); "
          f"PERSON findings in all: {persons} (the rest are names in the docstrings themselves, e.g. authors)")


def score(texts, labels, natural, dets):
    """Per class: tp, fp, fn. Natural values (reviewed) are labels when detected by anyone (pooled)."""
    stats = defaultdict(lambda: [0, 0, 0])
    for t, gold, ds in zip(texts, labels, dets):
        gold = list(gold)
        matched = [False] * len(gold)
        for a, b, c in ds:
            hit = [i for i, (ga, gb, gc) in enumerate(gold) if gc == c and a < gb and ga < b]
            if hit:
                for i in hit:
                    matched[i] = True
                stats[c][0] += 1
                continue
            if natural.get(vhash(t[a:b])) == c:  # reviewed natural PII (null = reviewed, not PII)
                stats[c][0] += 1
                continue
            stats[c][1] += 1
        for (ga, gb, gc), m in zip(gold, matched):
            if not m:
                stats[gc][2] += 1
    return stats


def natural_fn(texts, natural, *all_dets):
    """Reviewed natural positives that a system missed (pooled recall over what anyone found)."""
    pooled = defaultdict(set)
    for dets in all_dets:
        for i, (t, ds) in enumerate(zip(texts, dets)):
            for a, b, c in ds:
                if natural.get(vhash(t[a:b])) == c:
                    pooled[i].add((a, b, c))
    return pooled


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=2.0, help="MB of real code in the corpus (ours runs on all)")
    ap.add_argument("--presidio-mb", type=float, default=None, help="MB of the corpus presidio runs on (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3,
                    help="timed runs of every timing, ours and presidio's alike (median kept, after one warm-up)")
    ap.add_argument("--json", default=None, help="where to write the comparisons (default benchmarks/results/)")
    ap.add_argument("--label-dump", action="store_true", help="print natural detections for review (hashes only)")
    ap.add_argument("--ner-mb", type=float, default=0.3, help="MB of chat text for the NER measurement (0: skip)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)

    texts, labels, synth_labels, natural = build_corpus(int(args.mb * 1e6), args.seed)
    total = sum(len(t.encode()) for t in texts)
    print(f"corpus: {len(texts)} docs, {total / 1e6:.2f} MB, {sum(map(len, labels))} planted/hand labels, "
          f"{len(natural)} reviewed natural values")

    from datakit.stages.scrub_pii.scan import hyperscan_available

    ours_py, t_py = run_ours(texts, "python")
    ours_pl, t_ours = run_ours(texts, "polars", repeat=args.repeat)
    ours_rows, t_rows = run_ours(texts, "polars_rows", repeat=args.repeat)
    assert ours_pl == ours_py == ours_rows, "scan strategies disagree"
    scanner = "hyperscan" if hyperscan_available() else "polars"  # the stage's default (strategy: auto)
    t_hs = None
    if scanner == "hyperscan":
        ours_hs, t_hs = run_ours(texts, "hyperscan", repeat=args.repeat)
        assert ours_hs == ours_py, "scan strategies disagree"
    # quality is scored on what the stage finds: the scanner plus split string literals
    ours = stage_findings(texts)
    t_stage = run_stage(texts, repeat=args.repeat)
    t_stage_big = run_stage(texts, repeat=args.repeat, rows_per_batch=8192)

    # presidio on a prefix of the corpus (it is slow); ours re-timed on the same prefix
    k, acc = 0, 0
    limit = float("inf") if args.presidio_mb is None else args.presidio_mb * 1e6
    while k < len(texts) and acc < limit:
        acc += len(texts[k].encode())
        k += 1
    sub = texts[:k]
    # make the prefix include the hand cases too
    sub_idx = list(range(k)) + [i for i in range(len(texts) - len(HARD.read_text().splitlines()), len(texts)) if i >= k]
    sub = [texts[i] for i in sub_idx]
    sub_bytes = sum(len(t.encode()) for t in sub)
    from tests.support.presidio_baseline import presidio_default_analyzer

    plain = presidio_default_analyzer(regex_phone=False)
    tuned = presidio_default_analyzer(regex_phone=True)
    # every side on the same subset, alternated within each round after one warm-up round, CPU seconds
    found: dict = {}
    t = timed_alternated({"plain": presidio_run(sub, plain, found, "plain"),
                          "tuned": presidio_run(sub, tuned, found, "tuned"),
                          "scanner": lambda: scan_batch(sub, strategy=scanner),
                          "stage": stage_run(sub), "stage8k": stage_run(sub, 8192)}, runs=args.repeat)
    p_plain, p_tuned = found["plain"], found["tuned"]
    t_plain, t_tuned, t_osub, t_ssub, t_ssub_big = t["plain"], t["tuned"], t["scanner"], t["stage"], t["stage8k"]
    o_sub = stage_findings(sub)

    if args.label_dump:
        seen = {}
        for i, dsets in ((i, [ours[i]] + ([p_plain[sub_idx.index(i)]] if i in sub_idx else [])) for i in range(len(texts))):
            for ds in dsets:
                for a, b, c in ds:
                    if not any(c == gc and a < gb and ga < b for ga, gb, gc in labels[i]):
                        seen.setdefault((c, vhash(texts[i][a:b])), texts[i][max(0, a - 30):b + 10])
        for (c, h), ctx in sorted(seen.items()):
            print(f"{c}\t{h}\t{ctx!r}")
        return 0

    sub_labels = [labels[i] for i in sub_idx]
    s_ours_full = score(texts, labels, natural, ours)
    s_ours = score(sub, sub_labels, natural, o_sub)
    s_plain = score(sub, sub_labels, natural, p_plain)
    s_tuned = score(sub, sub_labels, natural, p_tuned)
    # natural positives found by anyone but missed by a system = extra false negatives (pooled recall)
    pooled = natural_fn(sub, natural, o_sub, p_plain, p_tuned)
    for s, dets in ((s_ours, o_sub), (s_plain, p_plain), (s_tuned, p_tuned)):
        for i, spans in pooled.items():
            for a, b, c in spans:
                if not any(c == dc and a < db and da < b for da, db, dc in dets[i]):
                    s[c][2] += 1

    def pr(s, c):
        tp, fp, fn = s.get(c, [0, 0, 0])
        p = tp / (tp + fp) if tp + fp else float("nan")
        rc = tp / (tp + fn) if tp + fn else float("nan")
        return p, rc, tp, fp, fn

    print(f"\nthroughput, MB per CPU-second on one core, on the same {sub_bytes / 1e6:.2f} MB "
          f"({len(sub)} docs, incl. the hard cases):")
    print(f"  ours/{scanner:9s} {sub_bytes / t_osub / 1e6:8.2f} MB/s   scanner (the stage's default strategy)")
    print(f"  ours/stage     {sub_bytes / t_ssub / 1e6:8.2f} MB/s   whole stage fn: Arrow records in, scrubbed records out"
          f" (1000-row batches)")
    print(f"  ours/stage8k   {sub_bytes / t_ssub_big / 1e6:8.2f} MB/s   the same in 8192-row batches (as the local engine"
          f" reads parquet)")
    print(f"  presidio/plain {sub_bytes / t_plain / 1e6:8.3f} MB/s   ({len(sub) / t_plain:.0f} docs/s)")
    print(f"  presidio/tuned {sub_bytes / t_tuned / 1e6:8.3f} MB/s   ({len(sub) / t_tuned:.0f} docs/s)")
    print(f"  ratios: scanner vs presidio/tuned {t_tuned / t_osub:5.0f}x, vs presidio/plain {t_plain / t_osub:5.0f}x;"
          f"  stage vs presidio/tuned {t_tuned / t_ssub:5.0f}x, vs presidio/plain {t_plain / t_ssub:5.0f}x;"
          f"  stage8k vs presidio/tuned {t_tuned / t_ssub_big:5.0f}x")
    print(f"\nours on the full corpus ({total / 1e6:.2f} MB, {len(texts)} docs):")
    if t_hs is not None:
        print(f"  ours/hyperscan {total / t_hs / 1e6:8.2f} MB/s   one hyperscan pass for every prefilter, Python scans those lines"
              " (the default)")
    print(f"  ours/polars    {total / t_ours / 1e6:8.2f} MB/s   Rust prefilter per detector picks rows + matched text,"
          " Python scans those lines")
    print(f"  ours/stage     {total / t_stage / 1e6:8.2f} MB/s   whole stage fn (1000-row batches)")
    print(f"  ours/stage8k   {total / t_stage_big / 1e6:8.2f} MB/s   whole stage fn (8192-row batches)")
    print(f"  ours/rows      {total / t_rows / 1e6:8.2f} MB/s   Rust prefilter picks rows, Python scans whole rows")
    print(f"  ours/python    {total / t_py / 1e6:8.2f} MB/s   every Python detector on every row (reference)")
    print("  (the scan strategies return identical findings: asserted above)")

    classes = sorted({c for s in (s_ours_full, s_plain) for c in s if not c.startswith("other:")},
                     key=lambda c: (c not in PII_CLASSES, c))
    print("\nprecision / recall per entity class of what the stage finds (scanner + split literals; NER off)")
    print("(subset shared with presidio; 'full' = ours on the full corpus)")
    print(f"  {'class':18} {'ours P':>7} {'ours R':>7} | {'full P':>7} {'full R':>7} {'n':>5} | "
          f"{'plain P':>7} {'plain R':>7} | {'tuned P':>7} {'tuned R':>7}")
    fmt = lambda x: "   n/a" if x != x else f"{x:7.3f}"  # noqa: E731
    for c in classes:
        po, ro, *_ = pr(s_ours, c)
        pf, rf, tp, fp, fn = pr(s_ours_full, c)
        pp, rp, *_ = pr(s_plain, c)
        pt, rt, *_ = pr(s_tuned, c)
        if c not in PRESIDIO_CLASS.values():
            pp = rp = pt = rt = float("nan")
        print(f"  {c:18} {fmt(po)} {fmt(ro)} | {fmt(pf)} {fmt(rf)} {tp + fn:5d} | {fmt(pp)} {fmt(rp)} | {fmt(pt)} {fmt(rt)}")
    other = defaultdict(int)
    for ds in p_plain:
        for _a, _b, c in ds:
            if c.startswith("other:"):
                other[c[6:]] += 1
    print("\npresidio/plain detections of types we do not score (on code these are mostly false positives):")
    print("  " + ", ".join(f"{k}={v}" for k, v in sorted(other.items(), key=lambda kv: -kv[1])))
    print("\nrecall on the synth generator's plants (datakit.synth.plants, an independent generator):")
    rec = defaultdict(lambda: [0, 0])
    for t_labels, ds in zip(synth_labels, ours):
        for ga, gb, gc in t_labels:
            rec[gc][1] += 1
            rec[gc][0] += any(c == gc and a < gb and ga < b for a, b, c in ds)
    print("  " + ", ".join(f"{c} {hit}/{n}" for c, (hit, n) in sorted(rec.items())))
    if rec.get("person"):
        print("  (synth plants person names in `# TODO(Name):` comments: found by the `person` pattern detector)")
    code_fp = sum(s_ours_full[c][1] for c in s_ours_full)
    code_tp = sum(s_ours_full[c][0] for c in s_ours_full)
    print(f"\nours overall on the full corpus: precision {code_tp / max(1, code_tp + code_fp):.3f} "
          f"({code_fp} false positives in {total / 1e6:.2f} MB of code)")
    cond = (f"{sub_bytes / 1e6:.2f} MB of code (stdlib + planted + hard cases), 1 core, CPU seconds, median of "
            f"{args.repeat} alternated rounds after 1 warm-up round; presidio predefined recognizers, regex phone ('tuned')")
    rp = pr(s_ours, "credit_card")
    shared = sorted(set(PRESIDIO_CLASS.values()))  # the classes presidio detects too: scored on the timed subset

    def overall(sc):
        tp, fp, fn = (sum(sc.get(c, [0, 0, 0])[k] for c in shared) for k in range(3))
        return tp / max(1, tp + fp), tp / max(1, tp + fn)

    (op, orc), (tpp, trc) = overall(s_ours), overall(s_tuned)
    same = (f"same texts; on the timed subset, over the classes presidio detects too ({', '.join(shared)}): ours "
            f"precision {op:.3f} recall {orc:.3f}, presidio (tuned) precision {tpp:.3f} recall {trc:.3f}; presidio "
            "has no secret recognizers")
    from importlib import metadata

    presidio = f"presidio-analyzer {metadata.version('presidio-analyzer')}"
    write("pii", [
        comparison("PII scanner vs presidio", sub_bytes / t_osub / 1e6, sub_bytes / t_tuned / 1e6, "MB/CPU-s",
                   f"{presidio} (tuned)", same, cond + f"; ours: {scanner} strategy"),
        comparison("scrub_pii stage fn vs presidio", sub_bytes / t_ssub / 1e6, sub_bytes / t_tuned / 1e6, "MB/CPU-s",
                   f"{presidio} (tuned, analysis only)", same,
                   cond + "; ours scans and replaces, Arrow in/out"),
    ], {"credit_card_pr": rp}, args.json)
    if args.ner_mb > 0:
        run_ner(int(args.ner_mb * 1e6), args.seed, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
