"""The lab's tables, raw samples and plots, derived from asv's own result files.

``tables`` (Markdown tables of one run), ``samples`` (every recorded timing
sample as CSV) and ``plots`` (matplotlib figures); the command line is
``python3 tools/dev.py report {tables,compare,csv,plots}`` (tools/commands/report.py).
Nothing here times anything: every figure comes from ``.asv/results``, read
through :mod:`tools.results`.
"""
