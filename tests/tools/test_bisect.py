"""bisect's check of --bench against the suite asv discovered: a mistyped name is named with the nearest real ones."""

import pytest

from tools import common, results
from tools.commands import bisect

SUITE = {"bench_cache.CacheStrategy.time_decode": {"params": [["16", "256"], ["'concat'", "'preallocated'"]]},
         "bench_environment.Environment.track_blas_threads": {"params": []}}


@pytest.fixture
def suite(monkeypatch):
    monkeypatch.setattr(results, "suite", lambda: SUITE)


def test_labels_are_asvs_point_names(suite):
    assert bisect.labels() == [f"bench_cache.CacheStrategy.time_decode({t}, {s})" for t in ("16", "256")
                               for s in ("'concat'", "'preallocated'")] + [
        "bench_environment.Environment.track_blas_threads"]


def test_a_pattern_that_selects_a_point_passes(suite):
    bisect.check_selects(r"CacheStrategy.time_decode\(256, 'concat'\)")
    bisect.check_selects("track_blas_threads")


def test_a_mistyped_point_is_named_with_the_nearest(suite):
    with pytest.raises(common.UserError) as error:
        bisect.check_selects(r"bench_cache.CacheStrategy.time_decod\(256, 'concat'\)")
    message, nearest = str(error.value).split("; the nearest: ")
    assert message == "--bench \"bench_cache.CacheStrategy.time_decod\\\\(256, 'concat'\\\\)\" selects no benchmark point of the suite"
    assert nearest.split(", bench")[0] == "bench_cache.CacheStrategy.time_decode(256, 'concat')"  # the closest first


def test_a_short_mistyped_name_is_matched_too(suite):
    with pytest.raises(common.UserError, match=r"; the nearest: bench_cache.CacheStrategy.time_decode\(16, 'concat'\)"):
        bisect.check_selects("CachStrategy.time_decod")


def test_a_name_near_nothing_is_named_alone(suite):
    with pytest.raises(common.UserError, match=r"^--bench 'zzz' selects no benchmark point of the suite$"):
        bisect.check_selects("zzz")


def test_nothing_is_checked_before_asv_has_discovered_the_suite(monkeypatch):
    monkeypatch.setattr(results, "suite", lambda: {})
    bisect.check_selects("anything")

