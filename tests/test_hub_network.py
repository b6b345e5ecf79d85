"""No network: a Hub download fails at once with the reason, not after the library's 23 s of retries
(`datakit/hub_network.py`). The name lookup is made to fail here (no network is touched)."""
from __future__ import annotations

import logging
import socket

import pytest

from datakit import hub_network


@pytest.fixture()
def no_dns(monkeypatch):
    """Every name lookup fails as on a machine without network; the library's retry sleeps are counted."""
    import huggingface_hub.constants as hc
    import huggingface_hub.utils._http as hub_http

    looked_up: list[str] = []

    def fail(host, *a, **k):
        looked_up.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    sleeps: list[float] = []

    class _Time:
        """The `time` module as huggingface_hub's retry loop sees it, its sleeps counted. Not `time.sleep`
        itself: found in CI, another thread of the test process (one a Spark test left, sleeping 1 s in a
        loop) then spun through the patched sleep and filled the list with 77,758 entries."""

        def __getattr__(self, name):
            import time

            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            sleeps.append(seconds)

    monkeypatch.setattr(socket, "getaddrinfo", fail)
    monkeypatch.setattr(hub_http, "time", _Time())
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hc, "ENDPOINT", "https://huggingface.co")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for v in hub_network._PROXY_VARIABLES:
        monkeypatch.delenv(v, raising=False)
    return looked_up, sleeps


def test_an_unresolvable_hub_is_named(no_dns) -> None:
    looked_up, _ = no_dns
    assert hub_network.hub_unreachable() == "the Hub's host huggingface.co does not resolve: Name or service not known"
    assert looked_up == ["huggingface.co"]


def test_behind_a_proxy_nothing_is_looked_up(no_dns, monkeypatch) -> None:
    looked_up, _ = no_dns
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    assert hub_network.hub_unreachable() is None and looked_up == []


def test_evals_pull_without_network_fails_at_once(no_dns, tmp_path, monkeypatch) -> None:
    from datakit.stages.decontaminate.registry import EvalError, pull

    _, sleeps = no_dns
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(EvalError) as err:
        pull(["mbpp-sanitized"])
    assert "huggingface.co does not resolve" in str(err.value) and "does not hold it" in str(err.value)
    assert sleeps == []  # no retry of the library ran


def test_evals_pull_without_network_reads_a_cached_snapshot_with_a_warning(no_dns, tmp_path, monkeypatch, caplog) -> None:
    from datakit.stages.decontaminate.registry import ENTRIES, pull
    from tests.test_eval_registry import ITEMS, _hub_cache

    _, sleeps = no_dns
    cache = tmp_path / "hf"
    _hub_cache(cache, "google-research-datasets/mbpp", "sanitized/test-00000-of-00001.parquet", ITEMS,
               ENTRIES["mbpp-sanitized"].revision or "4bb6404fdc6cacfda99d4ac4205087b89d32030c")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with caplog.at_level(logging.WARNING):
        (_, root, n), = pull(["mbpp-sanitized"])
    assert n == 1 and (root / "sanitized").is_dir() and sleeps == []  # its one file, read from the cache
    assert any("does not resolve" in r.getMessage() and r.getMessage().endswith("using the snapshot in the cache")
               for r in caplog.records)


def test_a_hub_tokenizer_without_network_fails_at_once(no_dns, tmp_path, monkeypatch) -> None:
    from datakit.stages.tokenize.tokenizers import TokenizerError, load_tokenizer

    _, sleeps = no_dns
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(TokenizerError) as err:
        load_tokenizer("acme/not-cached")
    assert "not in the Hugging Face cache and the Hub's host huggingface.co does not resolve" in str(err.value)
    assert sleeps == []


def test_evals_pull_with_hf_hub_offline_says_the_variable_stops_it(tmp_path, monkeypatch) -> None:
    """Found in review: `HF_HUB_OFFLINE=1 datakit evals pull mbpp` told the user to run `datakit evals pull
    mbpp` on a machine with network, and never named the variable that kept it from downloading."""
    from datakit.stages.decontaminate.registry import EvalError, pull

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EvalError) as err:
        pull(["mbpp"])
    assert "HF_HUB_OFFLINE is set" in str(err.value) and "run `datakit evals pull" not in str(err.value)


def test_the_fixture_sees_the_librarys_retries_when_nothing_checks_first(no_dns, tmp_path, monkeypatch) -> None:
    """The `sleeps == []` checks above can fail: with the name lookup not asked first, huggingface_hub's
    retry loop sleeps 1, 2, 4, 8, 8 s (counted here, not slept)."""
    from datakit.stages.decontaminate import registry

    _, sleeps = no_dns
    monkeypatch.setattr(registry, "hub_unreachable", lambda: None)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(registry.EvalError, match="the download from the Hugging Face Hub failed"):
        registry.pull(["mbpp-sanitized"])
    assert sleeps == [1, 2, 4, 8, 8]
