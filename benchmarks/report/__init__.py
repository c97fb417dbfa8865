"""The lab's tables, raw samples and plots, read from asv's own result files.

Run from the repository root (inside ``.venv``)::

    python -m benchmarks.report tables [--commit REV] [--machine NAME]
    python -m benchmarks.report compare BASE HEAD
    python -m benchmarks.report csv --out samples.csv
    python -m benchmarks.report plots --out plots/

It times nothing: every figure is derived from ``.asv/results`` (asv's
``Results`` files) and ``benchmarks.json``. asv imports every module under
``benchmarks/`` to discover benchmarks, in environments without asv or
matplotlib, so these modules import only the standard library at module level
and define no ``time_``/``track_``/``peakmem_``/``mem_`` names.
"""
