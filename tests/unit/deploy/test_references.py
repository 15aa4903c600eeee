"""What "present on /metrics" means (references.py), and that the references
are found in every kind of file that holds them."""

from __future__ import annotations

import pytest

from tests.unit.deploy.references import Exposition, References, adapter_exprs, grafana_expr, metric_names

PAGE = """# HELP gateway_requests_total HTTP requests
# TYPE gateway_requests_total counter
# HELP gateway_rate_limited_total Requests refused
# TYPE gateway_rate_limited_total counter
gateway_requests_total{route="chat",tier="paid",status="200"} 3.0
# TYPE gateway_time_to_first_token_seconds histogram
gateway_time_to_first_token_seconds_bucket{route="chat",le="0.1"} 1.0
# TYPE nv_inference_count counter
nv_inference_count{model="ensemble",version="1"} 4
# TYPE llm_prompt_tokens counter
"""


def test_present():
    page = Exposition.parse(PAGE)
    assert page.present("gateway_requests_total")
    assert page.present("gateway_rate_limited_total")  # declared, no sample yet
    assert page.present("gateway_time_to_first_token_seconds_bucket")
    assert page.present("gateway_time_to_first_token_seconds_sum")  # declared histogram
    assert page.present("nv_inference_count")
    assert page.present("llm_prompt_tokens_total")  # OpenMetrics-style counter family
    assert not page.present("gateway_requests")  # no such family
    assert not page.present("gateway_degradation_level")
    assert not page.present("nv_inference_count_bucket")  # not a histogram


def test_metric_names_from_promql():
    assert metric_names('sum by (le) (rate(a_bucket{x="1"}[5m])) / on (i) group_left b + c:d') == {
        "a_bucket",
        "b",
        "c:d",
    }
    assert metric_names('{__name__="e"}') == {"e"}
    with pytest.raises(ValueError):
        metric_names("sum(rate(x[5m])")
    assert metric_names(grafana_expr("rate(f_total[$__rate_interval]) > $threshold")) == {"f_total"}


def test_recorded_series_are_followed_to_their_sources():
    refs = References(recorded={"job:a:rate5m": {"a_total"}, "job:b:ratio": {"job:a:rate5m", "b"}})
    refs.add("job:b:ratio > 1 and up == 0", "alert X")
    assert refs.scraped() == {"a_total": {"alert X via job:b:ratio via job:a:rate5m"}, "b": {"alert X via job:b:ratio"}}


def test_adapter_queries():
    config = {
        "rules": [
            {
                "seriesQuery": 'q{namespace!="",pod!=""}',
                "metricsQuery": "sum(avg_over_time(<<.Series>>{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)",
            }
        ]
    }
    assert [metric_names(e) for e in adapter_exprs(config)] == [{"q"}, {"q"}]
