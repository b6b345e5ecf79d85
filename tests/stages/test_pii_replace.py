"""Replacement policy: placeholders keep code valid, pseudonyms are keyed and consistent, drop drops."""
from __future__ import annotations

import ast

import pytest

from datakit.stages.scrub_pii.replace import PiiKeyError, Replacer, load_key
from datakit.stages.scrub_pii.scan import scan_text
from datakit.stages.scrub_pii.stage import ScrubPiiConfig, scrub_texts

CODE = '''import boto3

DB_PASSWORD = "Tr0ub4dor&3"
AWS_KEY = 'AKIAIOSFODNN7EXAMPLE'
OWNER = "jane.doe@acme-corp.com"
LOG = "/Users/jane.doe/logs/app.log"
'''


def _scrub(text: str, **cfg) -> str:
    return scrub_texts([text], ScrubPiiConfig(ner="off", **cfg))[0]


def test_placeholders_keep_python_valid_and_quotes_intact() -> None:
    out = _scrub(CODE)
    ast.parse(out)  # still valid Python
    assert 'DB_PASSWORD = "<SECRET>"' in out
    assert "AWS_KEY = '<AWS_ACCESS_KEY>'" in out
    assert 'OWNER = "<EMAIL>"' in out
    assert 'LOG = "/Users/<USER>/logs/app.log"' in out
    for secret in ("Tr0ub4dor&3", "AKIAIOSFODNN7EXAMPLE", "jane.doe"):
        assert secret not in out


def test_pseudonym_is_consistent_keyed_and_not_redetected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAKIT_PII_KEY", "k1")
    cfg = ScrubPiiConfig(ner="off", policy={"email": "pseudonym"})
    a, b, c = scrub_texts(["to: ann@acme.com", "cc ann@acme.com", "bob@acme.com"], cfg)
    ta, tb, tc = a.split()[-1], b.split()[-1], c.split()[-1]
    assert ta == tb and ta != tc and ta.startswith("<EMAIL_") and "ann" not in ta
    assert scan_text(a) == []  # the pseudonym is not itself an email
    monkeypatch.setenv("DATAKIT_PII_KEY", "k2")
    (a2,) = scrub_texts(["to: ann@acme.com"], cfg)
    assert a2 != a  # a different key gives different pseudonyms


def test_pseudonym_without_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATAKIT_PII_KEY", raising=False)
    with pytest.raises(PiiKeyError, match="DATAKIT_PII_KEY"):
        ScrubPiiConfig(ner="off", policy={"email": "pseudonym"}).build_fn()


def test_key_from_file_and_never_in_repr(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATAKIT_PII_KEY", raising=False)
    kf = tmp_path / "pii.key"
    kf.write_text("s3cr3t-key-material\n")
    assert load_key(key_file=str(kf)) == b"s3cr3t-key-material"
    fn = ScrubPiiConfig(ner="off", default_policy="pseudonym", key_file=str(kf)).build_fn()
    assert "s3cr3t" not in repr(fn) and "s3cr3t" not in repr(fn.replacer)
    with pytest.raises(PiiKeyError, match="cannot read"):
        load_key(key_file=str(tmp_path / "missing.key"))


def test_key_cannot_come_from_the_pipeline_file() -> None:
    with pytest.raises(Exception, match="extra|key"):
        ScrubPiiConfig.model_validate({"kind": "scrub_pii", "key": "inline-secret"})


def test_drop_reason_is_stable_and_policy_driven() -> None:
    r = Replacer({"private_key": "drop", "email": "placeholder", "ipv4": "drop"})
    text = "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY----- 34.201.17.88"
    assert r.drop_reason(scan_text(text)) == "pii:ipv4"  # alphabetical among drop entities
    assert Replacer({}).drop_reason(scan_text("x@acme.com")) is None


def test_unknown_entity_in_policy_is_rejected() -> None:
    with pytest.raises(Exception, match="unknown entities"):
        ScrubPiiConfig(policy={"emial": "drop"})


def test_one_address_or_number_written_differently_gets_one_pseudonym() -> None:
    """Found in review: `jane.doe@x`, `JANE.DOE@x` and `Jane.Doe@x` got three pseudonyms, as did one phone
    number or card written with spaces, dashes or neither."""
    r = Replacer({e: "pseudonym" for e in ("email", "phone", "credit_card", "person")}, b"k" * 32)
    assert len({r.token("email", v) for v in ("jane.doe@acme.io", "JANE.DOE@acme.io", "Jane.Doe@ACME.io")}) == 1
    assert r.token("phone", "+1 415-867-5309") == r.token("phone", "+14158675309") == r.token("phone", "+1 (415) 867 5309")
    assert r.token("phone", "(415) 867-5309") != r.token("phone", "+14158675309")  # no country code: another value
    assert r.token("credit_card", "4111 1111 1111 1111") == r.token("credit_card", "4111-1111-1111-1111")
    assert r.token("person", "Olivia  Martinez") == r.token("person", "OLIVIA MARTINEZ")
    assert r.token("email", "jane.doe@acme.io") != r.token("email", "john.doe@acme.io")
    # the pickled replacer (what pool workers and Spark executors get) makes the same tokens
    import pickle

    assert pickle.loads(pickle.dumps(r)).token("email", "Jane.Doe@acme.io") == r.token("email", "jane.doe@acme.io")
