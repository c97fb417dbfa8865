"""tools/attend_overhead.py: the public attend's cost over its core, paired (issue 21's measurement)."""

import re

import numpy as np
import pytest

from tools import attend_overhead


def test_the_core_is_attention_by_definition():
    q, k, v = attend_overhead.inputs("tiny", np.random.default_rng(1))
    scores = np.einsum("...td,...sd->...ts", q, k) / np.sqrt(q.shape[-1])
    weights = np.exp(scores) / np.exp(scores).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(attend_overhead.core(q, k, v), weights @ v, rtol=1e-12, atol=1e-12)


def test_it_prints_each_calls_paired_ratio_over_the_core(capsys):
    assert attend_overhead.main(["--samples", "6"]) == 0
    out = capsys.readouterr().out
    assert "tiny: q (1, 1, 8), k (1, 4, 8), float64; 6 samples of 200 call(s), alternated" in out
    for call in ("attend (default)", "attend (check_finite=False)"):
        assert re.search(re.escape(call) + r": median [\d.]+ us, over the core [\d.]+x \[[\d.]+, [\d.]+\]", out)


@pytest.mark.parametrize("argv, message", [(["--samples", "5"], "at least 6"),
                                           (["--package", "/nonexistent"], "no kv_attention/__init__.py"),
                                           (["--shape", "70b"], "invalid choice")])
def test_bad_arguments_are_refused_with_a_message(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        attend_overhead.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
