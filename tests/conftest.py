"""Shared pytest setup: the ``gpu`` marker skips cleanly without CUDA; every test starts from seed 0;
databases start without the shipped records; ``pg_url`` gives a test its own schema on the PostgreSQL
server named by PATHTUNE_TEST_PG_URL.

Without CUDA the Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET must be set
before any kernel is decorated, so it is set here, before the test modules import pathtune.
"""
import os
import uuid

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Databases the tests open (also in `pathtune` subprocesses, which inherit this) start without the
# records shipped in perf_db/shipped/: no test depends on what a GPU session shipped.
# (tests/test_shipped.py checks the shipped files themselves.)
import tempfile  # noqa: E402

os.environ["PATHTUNE_SHIPPED_DIR"] = tempfile.mkdtemp(prefix="pathtune-no-shipped-")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def isolated_perf_db(monkeypatch, tmp_path):
    """No PATHTUNE_DB_URL from the caller's shell, and a shipped-records folder of this test's own,
    empty (a test that needs shipped files writes them there or points PATHTUNE_SHIPPED_DIR elsewhere)."""
    monkeypatch.delenv("PATHTUNE_DB_URL", raising=False)
    empty = tmp_path / "shipped-empty"
    empty.mkdir()
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(empty))


@pytest.fixture
def pg_url():
    """A database URL whose search_path is a fresh schema on PATHTUNE_TEST_PG_URL's server (dropped
    afterwards), so tests and concurrent workers can share one database."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = os.environ.get("PATHTUNE_TEST_PG_URL")
    if not base:
        pytest.skip("set PATHTUNE_TEST_PG_URL=postgresql+psycopg://... to run")
    schema = f"pathtune_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(scope="module")
def fake_h200_env():
    """This machine's environment record posing as an H200 host (the dispatch tests' records are keyed on it)."""
    from pathtune.runtime.environment import collect_env

    info = collect_env()
    info.update(gpu_name="NVIDIA H200", compute_capability="9.0", cuda_runtime="12.8", ptxas="12.8.93",
                driver="570.1", sm_count=132, gpu_memory_bytes=150_000_000_000, gpu_count=1)
    return info


@pytest.fixture
def spy_launches(monkeypatch):
    """``spy(module, name, what=grid)`` -> list: ``what(grid, launch kwargs)`` of every launch of the Triton
    kernel ``module.name`` during the test (each launch still runs)."""
    def spy(module, name, what=lambda grid, kw: grid):
        seen, real = [], getattr(module, name)

        class Spy:
            # the kernel's attributes (its Python function, hooks) as the real one; a launch returns no compiled
            # kernel, so that launchers which keep one for repeat launches (decode's KernelLauncher) still
            # launch every call through the spy
            def __getattr__(self, attr):
                return getattr(real, attr)

            def __getitem__(self, grid):
                def launch(*args, **kw):
                    seen.append(what(grid, kw))
                    real[grid](*args, **kw)
                return launch

        monkeypatch.setattr(module, name, Spy())
        return seen
    return spy


@pytest.fixture()
def spec_copy(tmp_path, monkeypatch):
    """A copy of the packaged spec in tmp_path (the tuner tests' --spec), with no shipped records, a private
    cache, the fake cost model's call log (tests/tune_fake.py) in tmp_path and no PATHTUNE_DB_URL."""
    import shutil
    from pathlib import Path

    import pathtune.specs

    path = tmp_path / "spec.yaml"
    shutil.copy(Path(pathtune.specs.__file__).parent / "path_attention.yaml", path)
    (tmp_path / "no-shipped").mkdir()
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(tmp_path / "no-shipped"))
    monkeypatch.setenv("PATHTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATHTUNE_FAKE_LOG", str(tmp_path / "calls.log"))
    monkeypatch.delenv("PATHTUNE_DB_URL", raising=False)
    return path
