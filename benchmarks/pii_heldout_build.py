"""Build the held-out PII evaluation corpus (tests/data/pii_heldout/corpus.jsonl).

Why a second corpus: benchmarks/pii.py plants values made by generators written beside the
detectors, so its recall says little about text the detectors were not written against (a
held-out check found card numbers at the end of a sentence - "4111 1111 1111 1111." - missed
while that benchmark said recall 1.0). Every value here comes from a source the detectors'
authors did not write:

- credit cards: card-processor test numbers as published in their developer docs (Stripe,
  Braintree, Adyen), written in each brand's documented grouping (Amex 4-6-5,
  Diners 4-6-4, 19-digit 4-4-4-4-3) with spaces, dashes or none;
- IBANs: the SWIFT IBAN registry's sample numbers as collected by python-stdnum's tests
  (iban_registry_valid.txt), and its mangled/broken-checksum numbers as negatives;
- phone numbers: libphonenumber's example numbers (`phonenumbers.example_number_for_type`)
  for 40 regions, in E.164, international and national formats;
- e-mails, IPv4/IPv6, US SSNs: Faker (several locales), an independent generator;
- secrets: provider-documented example keys and token formats (AWS docs' example key pair,
  jwt.io's example token, Stripe's documented test keys, GitHub/Slack/Google/OpenAI/Anthropic
  formats) and formats of providers the detectors do not name (SendGrid, npm, PyPI, Hugging
  Face, Twilio, Shopify, DigitalOcean, Mailgun, Azure storage keys) - recall on those is what
  a new key format costs us;
- carriers: human-style chat and support messages, logs, CSV, JSON and Markdown written for
  this corpus (sentence-final punctuation, parentheses, quotes, bullets), not the code
  assignments the detectors were tuned on.

The corpus is committed (deterministic from --seed) so numbers stay comparable; rebuild only to
extend it, and say so in the commit. Usage: .venv/bin/python benchmarks/pii_heldout_build.py
"""
from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "pii_heldout"

# (number, brand, source) - published processor test numbers
CARDS = [
    ("4242424242424242", "visa", "stripe"), ("4000056655665556", "visa", "stripe"),
    ("5555555555554444", "mastercard", "stripe"), ("2223003122003222", "mastercard", "stripe"),
    ("5200828282828210", "mastercard", "stripe"), ("5105105105105100", "mastercard", "stripe"),
    ("378282246310005", "amex", "stripe"), ("371449635398431", "amex", "stripe"),
    ("6011111111111117", "discover", "stripe"), ("6011000990139424", "discover", "stripe"),
    ("3056930009020004", "diners", "stripe"), ("36227206271667", "diners14", "stripe"),
    ("3566002020360505", "jcb", "stripe"), ("6200000000000005", "unionpay", "stripe"),
    ("6205500000000000004", "unionpay19", "stripe"),
    ("4111111111111111", "visa", "braintree"), ("4005519200000004", "visa", "braintree"),
    ("4009348888881881", "visa", "braintree"), ("4012000033330026", "visa", "braintree"),
    ("4012000077777777", "visa", "braintree"), ("4012888888881881", "visa", "braintree"),
    ("4217651111111119", "visa", "braintree"), ("4500600000000061", "visa", "braintree"),
    ("3530111333300000", "jcb", "braintree"), ("6304000000000000", "maestro", "braintree"),
    ("5500000000000004", "mastercard", "adyen"), ("6759649826438453", "maestro", "adyen"),
    ("4988438843884305", "visa", "adyen"), ("4166676667666746", "visa", "adyen"),
    ("2222400070000005", "mastercard", "adyen"), ("370000000000002", "amex", "adyen"),
]

# (value, provider) - documented example keys and key formats ({r:N} = N random base62 chars, {h:N} hex)
SECRETS = [
    ("AKIAIOSFODNN7EXAMPLE", "aws docs access key id"),
    ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws docs secret key"),
    ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5"
     "MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c", "jwt.io example"),
    ("sk_test_4eC39HqLyjWDarjtT1zdp7dc", "stripe docs test key"),
    ("ghp_{r:36}", "github classic pat"), ("github_pat_11{R:20}_{r:59}", "github fine-grained pat"),
    ("gho_{r:36}", "github oauth"), ("xoxb-{d:12}-{d:13}-{r:24}", "slack bot token"),
    ("xoxp-{d:12}-{d:12}-{d:13}-{h:32}", "slack user token"),
    ("https://hooks.slack.com/services/T{R:8}/B{R:10}/{r:24}", "slack webhook"),
    ("AIza{u:35}", "google api key"), ("sk-proj-{u:48}", "openai project key"),
    ("sk-ant-api03-{u:93}AA", "anthropic key"), ("glpat-{u:20}", "gitlab pat"),
    ("SG.{u:22}.{u:43}", "sendgrid key"), ("npm_{r:36}", "npm token"),
    ("pypi-AgEIcHlwaS5vcmc{u:50}", "pypi token"), ("hf_{r:34}", "hugging face token"),
    ("SK{h:32}", "twilio api key"), ("shpat_{h:32}", "shopify token"),
    ("dop_v1_{h:64}", "digitalocean token"), ("key-{h:32}", "mailgun key"),
    ("DefaultEndpointsProtocol=https;AccountName=devstore{d:3};AccountKey={b:86}==;EndpointSuffix=core.windows.net",
     "azure storage connection string"),
]

PHONE_REGIONS = ["US", "CA", "GB", "DE", "FR", "IT", "ES", "NL", "BE", "CH", "AT", "SE", "NO", "DK", "FI", "PL",
                 "CZ", "PT", "IE", "GR", "TR", "RU", "UA", "IL", "AE", "IN", "PK", "CN", "JP", "KR", "SG", "AU",
                 "NZ", "BR", "MX", "AR", "CO", "ZA", "NG", "KE"]

FAKER_LOCALES = ["en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL", "pt_BR", "pl_PL"]

# human-style carriers; {v} is the value. Sentence-final punctuation, brackets and quotes on purpose.
CHAT = [
    "my card is {v}.", "Card number: {v}, exp 04/29, cvc 123", "can you see why {v} gets declined?",
    "I tried {v} and it still fails!", "payment with ({v}) was refused", "use \"{v}\" for the test",
    "- {v}\n- something else", "the customer gave {v}; please verify", "Is {v} valid?",
    "```\n{v}\n```\nthis is what the form sent", "log line: user submitted value={v} at checkout",
    "{v}", "Hi team, the number is {v}. Thanks", "'{v}' is what I got back from the API",
    "see row 3: {v},ok,2024-01-02", "{{\"value\": \"{v}\", \"ok\": true}}", "<td>{v}</td>",
    "Why does my regex not match {v}?", "ping me: {v} (after 5pm)", "> quoted: {v}",
]
CODE = [
    "EMAIL = \"{v}\"", "send_mail(to='{v}')", "# contact {v} for access", "    \"{v}\",",
    "value: {v}", "export SOME_VALUE={v}", "assert normalize(\"{v}\") == expected",
]


def _fill(pattern: str, r: random.Random) -> str:
    alph = {"r": string.ascii_letters + string.digits, "R": string.ascii_uppercase + string.digits,
            "u": string.ascii_letters + string.digits + "_-", "h": "0123456789abcdef", "d": string.digits,
            "b": string.ascii_letters + string.digits + "+/"}
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "{" and pattern[i + 2:i + 3] == ":":
            j = pattern.index("}", i)
            kind, n = pattern[i + 1], int(pattern[i + 3:j])
            out.append("".join(r.choice(alph[kind]) for _ in range(n)))
            i = j + 1
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def _card_formats(num: str, brand: str) -> list[str]:
    if len(num) == 15:  # amex 4-6-5
        groups = [num[:4], num[4:10], num[10:]]
    elif len(num) == 14:  # diners 4-6-4
        groups = [num[:4], num[4:10], num[10:]]
    else:
        groups = [num[i:i + 4] for i in range(0, len(num), 4)]
    return [num, " ".join(groups), "-".join(groups)]


def _luhn(num: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(num)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def _iban_lines(path: Path) -> list[str]:
    return [x.strip() for x in path.read_text().splitlines() if x.strip() and not x.startswith("#")]


def build(seed: int) -> list[dict]:
    import phonenumbers
    from faker import Faker
    r = random.Random(seed)
    docs: list[dict] = []

    def add(value: str, cls: str, source: str, carriers: list[str] = CHAT) -> None:
        tpl = r.choice(carriers)
        pre, post = tpl.split("{v}")
        pre, post = pre.replace("{{", "{").replace("}}", "}"), post.replace("{{", "{").replace("}}", "}")
        text = pre + value + post
        labels = [[len(pre), len(pre) + len(value), cls]] if cls else []
        docs.append({"text": text, "labels": labels, "source": source})

    for num, brand, src in CARDS:
        if not _luhn(num):  # a mis-copied number would be a wrong label, not a miss
            raise ValueError(f"published test card fails Luhn: {brand} from {src}")
        for f in _card_formats(num, brand):
            add(f, "credit_card", f"card:{src}:{brand}")
    for iban in _iban_lines(DATA / "iban_registry_valid.txt"):
        add(iban, "iban", "iban:registry")
    for iban in _iban_lines(DATA / "iban_registry_invalid.txt"):
        add(iban, "", "iban:registry_invalid")
    fmts = {"e164": phonenumbers.PhoneNumberFormat.E164, "intl": phonenumbers.PhoneNumberFormat.INTERNATIONAL,
            "national": phonenumbers.PhoneNumberFormat.NATIONAL}
    for region in PHONE_REGIONS:
        for ptype in (phonenumbers.PhoneNumberType.MOBILE, phonenumbers.PhoneNumberType.FIXED_LINE):
            n = phonenumbers.example_number_for_type(region, ptype)
            if n is None:
                continue
            for name, f in fmts.items():
                add(phonenumbers.format_number(n, f), "phone", f"phone:{name}:{region}")
    for loc in FAKER_LOCALES:
        fk = Faker(loc)
        fk.seed_instance(seed)
        for _ in range(12):
            add(fk.email(), "email", f"email:faker:{loc}", CHAT + CODE)
        for _ in range(4):
            add(fk.ipv4_public(), "ip", "ipv4:faker")
            add(fk.ipv6(), "ip", "ipv6:faker")
    fk = Faker("en_US")
    fk.seed_instance(seed)
    for _ in range(40):
        add(fk.ssn(), "us_ssn", "ssn:faker")
    for pattern, provider in SECRETS:
        for _ in range(4):
            add(_fill(pattern, r), "secret", f"secret:{provider}", CHAT + CODE)
    return docs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    docs = build(args.seed)
    out = DATA / "corpus.jsonl"
    with out.open("w") as fh:
        for d in docs:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    print(f"{len(docs)} documents -> {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
