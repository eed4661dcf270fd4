"""What the store (``_store.py``) and the dump (``_dump.py``) both read stored rows with: a measurement
row as a ``Measurement``, and the GPU-name filter."""
from __future__ import annotations

import json
from typing import Any, Optional

from sqlalchemy import func

from ._keys import Measurement
from ._models import MeasurementRow

__all__ = ["measurement_of", "gpu_clause"]


def measurement_of(row: MeasurementRow) -> Measurement:
    return Measurement(status=row.status, median_ms=row.median_ms, p20_ms=row.p20_ms, p80_ms=row.p80_ms,
                       n_reps=row.n_reps, bench_method=row.bench_method,
                       errors=json.loads(row.errors_json) if row.errors_json else None,
                       max_rel_err=row.max_rel_err, baseline_ms=row.baseline_ms, baseline_name=row.baseline_name,
                       study_name=row.study_name, trial_number=row.trial_number, command=row.command,
                       message=row.message, created_at=row.created_at)


def gpu_clause(column: Any, gpu: Optional[str]) -> Any:
    """Case-insensitive substring match: ``--gpu h200`` matches "NVIDIA H200"."""
    return func.lower(column).contains(gpu.strip().lower(), autoescape=True)
