"""Diagnosis: what a failure means and what to do about it.

    catalog.toml   the signatures: regexes over logs / failure text, title, remedy (per mode), priority
    catalog.py     the catalog loaded and matched (`diagnose`)
    found.py       a `Diagnosis`, one per root cause (`fold`), and a failure's first line (`headline`)
    subjects.py    what a failure names: the mode a service runs in (which remedy), its ranks, pids and GPUs
"""

from __future__ import annotations

from pytest_dflash.evidence.diagnosis.catalog import (
    CATALOG_PATH,
    Catalog,
    Signature,
    default_catalog,
    diagnose,
    load_catalog,
)
from pytest_dflash.evidence.diagnosis.found import MODES, Diagnosis, diagnosis_text, fold, with_subject

__all__ = ["CATALOG_PATH", "MODES", "Catalog", "Diagnosis", "Signature", "default_catalog", "diagnose",
           "diagnosis_text", "fold", "load_catalog", "with_subject"]
