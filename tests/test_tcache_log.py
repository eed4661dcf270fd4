"""benchmarks/tcache/pathtune_tcache_log.py: Triton's file cache, noting each entry a process opens (what
benchmarks/gpu_session.sh brings back of the compile cache)."""
from __future__ import annotations

import pytest

from repo_scripts import ROOT


@pytest.fixture
def logged(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "tcache"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "pathtune_tcache_log:LoggingCacheManager")
    log = tmp_path / "used.txt"
    monkeypatch.setenv("TRITON_CACHE_USED_LOG", str(log))
    return tmp_path / "cache", log


def test_each_opened_entry_is_noted_and_the_cache_still_works(logged):
    from triton.runtime.cache import get_cache_manager

    cache, log = logged
    first = get_cache_manager("0a1b2c")             # Triton's keys are hex hashes
    assert type(first).__name__ == "LoggingCacheManager"
    path = first.put(b"cubin bytes", "k.cubin")
    assert first.get_file("k.cubin") == path and open(path, "rb").read() == b"cubin bytes"
    other = get_cache_manager("3d4e5f")
    again = get_cache_manager("0a1b2c")             # a later process opening the same entry finds it
    assert again.get_file("k.cubin") == path
    assert log.read_text().split() == [first.key, other.key, first.key]
    assert {p.name for p in cache.iterdir()} == {first.key, other.key}   # the noted names are the entries' folders


def test_nothing_is_noted_without_a_log(logged, monkeypatch):
    from triton.runtime.cache import get_cache_manager

    cache, log = logged
    monkeypatch.delenv("TRITON_CACHE_USED_LOG")
    get_cache_manager("6f70").put(b"x", "k.json")
    assert not log.exists() and len(list(cache.iterdir())) == 1
