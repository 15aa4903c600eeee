"""Every metric name that something deployed reads, found by parsing what
reads it: the PromQL of the recording and alert rules, of each Grafana panel
and of the prometheus-adapter rules, and the HPA's custom metric (through the
adapter rule that serves it). Recording rules' outputs are followed to the
metrics they are computed from. Used by the unit tests (the files parse, the
references resolve) and by tests/e2e/test_deploy_metrics.py (a live stack
exposes every name).

"Present" on a /metrics page (`present`): the page declares the family (its
`# TYPE` line: a labelled family with no sample yet, e.g. a counter nobody has
incremented, still declares itself) or has a sample of that exact name; a
histogram's `_bucket` / `_sum` / `_count` series are present when the page
declares the histogram; a counter queried as `x_total` is present when the page
declares `x_total` or, in OpenMetrics style, `x` as a counter."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser
import yaml

# series Prometheus makes itself, not scraped from a target
SYNTHETIC = frozenset(
    {
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_series_added",
        "scrape_samples_post_metric_relabeling",
        "ALERTS",
        "ALERTS_FOR_STATE",
    }
)
_GRAFANA_VARIABLE = re.compile(r"\$(?:__\w+|\{\w+\}|\w+)")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (raises on a PromQL syntax error)."""
    names: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            else:  # {__name__="x"}
                for matcher in node.matchers.matchers:
                    if matcher.name == "__name__":
                        names.add(matcher.value)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def grafana_expr(expr: str) -> str:
    """A panel's query with Grafana's variables replaced by something PromQL parses."""
    return _GRAFANA_VARIABLE.sub(lambda m: "5m" if "interval" in m.group(0) else "1", expr)


def dashboard_exprs(path: Path) -> list[str]:
    def panels(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for panel in items:
            out.append(panel)
            out.extend(panels(panel.get("panels", [])))  # rows
        return out

    data = json.loads(path.read_text(encoding="utf-8"))
    return [grafana_expr(t["expr"]) for p in panels(data["panels"]) for t in p.get("targets", []) if t.get("expr")]


def adapter_exprs(config: dict[str, Any]) -> list[str]:
    """The seriesQuery and the metricsQuery (its template filled in) of each rule."""
    exprs = []
    for rule in config["rules"]:
        series_query = rule["seriesQuery"]
        (series,) = metric_names(series_query)
        exprs.append(series_query)
        exprs.append(
            rule["metricsQuery"]
            .replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", 'namespace="x",pod="y"')
            .replace("<<.GroupBy>>", "pod")
        )
    return exprs


def adapter_served(config: dict[str, Any]) -> dict[str, str]:
    """Custom metric name as the HPA asks for it -> the series it is computed from."""
    served = {}
    for rule in config["rules"]:
        (series,) = metric_names(rule["seriesQuery"])
        name = rule.get("name", {})
        served[re.sub(name.get("matches", "^(.*)$"), name.get("as", r"\1"), series) if name else series] = series
    return served


@dataclass
class References:
    used_by: dict[str, set[str]] = field(default_factory=dict)  # metric -> where (file: what)
    recorded: dict[str, set[str]] = field(default_factory=dict)  # recording rule -> the metrics it reads

    def add(self, expr: str, where: str) -> None:
        for name in metric_names(expr):
            self.used_by.setdefault(name, set()).add(where)

    def scraped(self) -> dict[str, set[str]]:
        """The names a target must expose: recorded series followed to their sources."""
        out: dict[str, set[str]] = {}
        pending = list(self.used_by.items())
        seen: set[str] = set()
        while pending:
            name, where = pending.pop()
            if name in seen:
                out.get(name, set()).update(where)
                continue
            seen.add(name)
            if name in self.recorded:
                pending.extend((source, {f"{w} via {name}" for w in where}) for source in self.recorded[name])
            elif name not in SYNTHETIC:
                out.setdefault(name, set()).update(where)
        return out


def collect(rule_files: list[Path], dashboards: list[Path], manifests: dict[str, list[dict[str, Any]]]) -> References:
    """Every reference in the rule files, the dashboards and the rendered manifests
    (the PrometheusRule, the adapter's config, the HPA)."""
    refs = References()
    for path in rule_files:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                where = f"{path.name}: {rule.get('record') or rule.get('alert')}"
                if "record" in rule:
                    refs.recorded[rule["record"]] = metric_names(rule["expr"])
                refs.add(rule["expr"], where)
    for path in dashboards:
        for expr in dashboard_exprs(path):
            refs.add(expr, f"{path.name}: panel")
    objects = [o for objs in manifests.values() for o in objs]
    served: dict[str, str] = {}
    for obj in objects:
        if obj["kind"] == "PrometheusRule":
            for group in obj["spec"]["groups"]:
                for rule in group["rules"]:
                    if "record" in rule:
                        refs.recorded[rule["record"]] = metric_names(rule["expr"])
                    refs.add(rule["expr"], f"PrometheusRule: {rule.get('record') or rule.get('alert')}")
        if obj["kind"] == "ConfigMap" and "config.yaml" in obj.get("data", {}):
            config = yaml.safe_load(obj["data"]["config.yaml"])
            served.update(adapter_served(config))
            for expr in adapter_exprs(config):
                refs.add(expr, "prometheus-adapter rule")
    for obj in objects:
        if obj["kind"] == "HorizontalPodAutoscaler":
            for metric in obj["spec"]["metrics"]:
                name = metric["pods"]["metric"]["name"]
                if name not in served:
                    raise AssertionError(f"the HPA's metric {name} is served by no prometheus-adapter rule")
                refs.used_by.setdefault(served[name], set()).add("HorizontalPodAutoscaler")
    return refs


@dataclass
class Exposition:
    declared: dict[str, str]  # family -> type, from `# TYPE` lines
    sampled: set[str]

    @classmethod
    def parse(cls, text: str) -> Exposition:
        declared, sampled = {}, set()
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(None, 3)
                declared[name] = kind.strip()
            elif line and not line.startswith("#"):
                sampled.add(re.split(r"[{\s]", line, maxsplit=1)[0])
        return cls(declared, sampled)

    def present(self, name: str) -> bool:
        if name in self.declared or name in self.sampled:
            return True
        for suffix, kinds in (
            ("_bucket", ("histogram",)),
            ("_sum", ("histogram", "summary")),
            ("_count", ("histogram", "summary")),
            ("_total", ("counter",)),
        ):
            if name.endswith(suffix) and self.declared.get(name[: -len(suffix)]) in kinds:
                return True
        return False
