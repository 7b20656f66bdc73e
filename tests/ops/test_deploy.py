"""deploy/: the Grafana dashboard and the Prometheus alert rules name only metrics a
running server exports (scraped from a real ``headrace serve`` after some traffic)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from headrace.client.tank import TankClient
from headrace.protocols.tank import BundleMessage
from tests.ops.conftest import WAIT_S, free_port, listener_args

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana-dashboard.json"
ALERTS = DEPLOY / "prometheus-alerts.yml"

PROMETHEUS_MADE = frozenset({"up"})
"""Series Prometheus itself records for every scrape target."""

METRIC_NAME = re.compile(r"\b((?:headrace|process|python)_[a-zA-Z0-9_]+)")
"""A metric name of the server's families inside a PromQL expression."""

SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("_count", "_sum"),
    "info": ("_info",),
}


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", ())]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for variable in dashboard["templating"]["list"]:
        if "definition" in variable:
            exprs.append(variable["definition"])
    return exprs


def _alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _exported(text: str) -> set[str]:
    """Every series name the exposition can hold: samples, and each family's
    names by type (a labelled counter has no sample until it is first counted)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


async def _traffic(port: int) -> None:
    async with await TankClient.connect("127.0.0.1", port) as client:
        await client.create_topic("deploy", 1)
        for n in range(3):
            await client.produce("deploy", 0, [BundleMessage(f"event {n}".encode())])


def test_every_metric_the_deploy_files_name_is_exported(start_serve: Any) -> None:
    http, tank = free_port(), free_port()
    serve = start_serve(*listener_args(http=http, tank=tank))
    asyncio.run(asyncio.wait_for(_traffic(tank), WAIT_S))
    _, text = serve.get("/metrics")
    exported = _exported(text) | PROMETHEUS_MADE
    exprs = _dashboard_exprs() + [rule["expr"] for rule in _alert_rules()]
    named = {name for expr in exprs for name in METRIC_NAME.findall(expr)}
    assert "headrace_stream_events_total" in named and "process_open_fds" in named
    assert not named - exported, f"not exported by the server: {sorted(named - exported)}"
    # The samples the panels plot exist after traffic, not only their families.
    samples = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    for name in ("headrace_stream_events_total", "headrace_append_seconds_bucket"):
        assert name in samples


def test_alert_rules_say_what_and_how_bad() -> None:
    rules = _alert_rules()
    assert rules
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["annotations"]["description"], rule["alert"]
