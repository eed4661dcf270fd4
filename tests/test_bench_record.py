"""`pathtune bench --record` stores pathtune's times with the same-run SDPA baseline in perf_db."""
from pathtune.perf_db import PerfDB
from pathtune.tuning.bench import BenchRow, format_table, record_rows


def test_record_rows_feed_overhead_query(tmp_path):
    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    ok = BenchRow(64, 4096, 8, 16, False, times={"pathtune_f": 2.0, "pathtune_fb": 9.0, "sdpa_flash_f": 1.0,
                                                  "sdpa_flash_fb": 3.0}, errors={"o": 2e-3})
    broken = BenchRow(128, 4096, 8, 8, False, failures={"pathtune": "OutOfResources: shared memory"})
    n = record_rows([ok, broken], url, None, "pathtune bench --record (test)")
    assert n == 4
    with PerfDB(url) as db:
        rows = db.overhead(by="head_dim")
        assert {(r["head_dim"], r["pass"]) for r in rows} == {(64, "fwd"), (64, "bwd")}
        by_pass = {r["pass"]: r for r in rows}
        assert abs(by_pass["fwd"]["ratio"] - 2.0) < 1e-9 and abs(by_pass["bwd"]["ratio"] - 3.0) < 1e-9
        statuses = sorted(r["status"] for r in db.query(head_dim=128))
        assert statuses == ["crash", "crash"]
    assert format_table([ok, broken]).row_count == 2
