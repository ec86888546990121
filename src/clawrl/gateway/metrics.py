"""Gateway metrics in the Prometheus text exposition format (version 0.0.4), hand-written.

Families (all prefixed ``clawrl_``):

* ``gateway_requests_total{route, status}`` — HTTP requests answered, by route and status code.
* ``gateway_errors_total{kind}`` — errors answered, by kind (:func:`clawrl.gateway.errors.error_kind`).
* ``gateway_prompt_tokens_total`` / ``gateway_completion_tokens_total`` — tokens of recorded
  turns (prompt tokens counted once per choice).
* ``gateway_request_latency_seconds{route}`` — histogram of request latency (for streams: until
  the last byte was produced).
* ``gateway_ttft_seconds`` — histogram of time to first token per choice.
* ``gateway_turns_recorded_total{status}`` and ``gateway_untrainable_turns_total{reason}`` —
  every recorded turn, and every one that will not be trained on with its reason (no silent
  drops).
* ``gateway_spliced_messages_total`` — history assistant messages whose exact recorded
  completion ids replaced the template's re-rendering (:mod:`clawrl.gateway.splice`).
* ``gateway_ignored_fields_total{field}`` — request fields accepted without effect.
* ``gateway_in_flight`` — requests being served now.
* ``engine_queue_depth``, ``engine_batch_size``, ``engine_policy_version``,
  ``engine_generated_tokens_total`` — read from the engine at scrape time.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from typing import Any

from clawrl.engine import Engine

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

FAMILIES: dict[str, tuple[str, str]] = {
    "clawrl_gateway_requests_total": ("counter", "HTTP requests answered, by route and status."),
    "clawrl_gateway_errors_total": ("counter", "Errors answered, by kind."),
    "clawrl_gateway_prompt_tokens_total": ("counter", "Prompt tokens of recorded turns."),
    "clawrl_gateway_completion_tokens_total": ("counter", "Sampled tokens of recorded turns."),
    "clawrl_gateway_request_latency_seconds": ("histogram", "Request latency in seconds."),
    "clawrl_gateway_ttft_seconds": ("histogram", "Time to first token per choice, seconds."),
    "clawrl_gateway_turns_recorded_total": ("counter", "Turns recorded in the store, by status."),
    "clawrl_gateway_untrainable_turns_total": (
        "counter",
        "Recorded turns that will not be trained on, by reason.",
    ),
    "clawrl_gateway_spliced_messages_total": (
        "counter",
        "History assistant messages replaced by their exact recorded completion ids.",
    ),
    "clawrl_gateway_ignored_fields_total": (
        "counter",
        "Request fields accepted without effect, by field name.",
    ),
    "clawrl_gateway_in_flight": ("gauge", "Requests being served now."),
    "clawrl_engine_queue_depth": ("gauge", "Requests waiting for a slot in the engine batch."),
    "clawrl_engine_batch_size": ("gauge", "Sequences the engine decodes together now."),
    "clawrl_engine_policy_version": ("gauge", "Policy version the engine serves now."),
    "clawrl_engine_generated_tokens_total": ("counter", "Tokens the engine sampled."),
}

Labels = tuple[tuple[str, str], ...]


def _labels(labels: dict[str, Any]) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt_labels(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    items = [*labels, *([extra] if extra else [])]
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}"


def _fmt_value(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if float(v).is_integer():
        return str(int(v))
    return repr(float(v))


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, edge in enumerate(self.buckets):
            if value <= edge:
                self.counts[i] += 1


class Metrics:
    """Thread-safe counters, gauges and histograms with a Prometheus text rendering."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[Labels, float]] = defaultdict(dict)
        self._hists: dict[str, dict[Labels, _Histogram]] = defaultdict(dict)

    def inc(self, name: str, value: float = 1.0, **labels: Any) -> None:
        """Add ``value`` to counter ``name`` with ``labels``.

        Raises:
            KeyError: ``name`` is not a declared family.
        """
        _ = FAMILIES[name]
        key = _labels(labels)
        with self._lock:
            series = self._values[name]
            series[key] = series.get(key, 0.0) + value

    def set(self, name: str, value: float, **labels: Any) -> None:
        """Set gauge ``name`` to ``value``."""
        _ = FAMILIES[name]
        with self._lock:
            self._values[name][_labels(labels)] = float(value)

    def observe(self, name: str, value: float, **labels: Any) -> None:
        """Record ``value`` (seconds) in histogram ``name``."""
        _ = FAMILIES[name]
        key = _labels(labels)
        with self._lock:
            series = self._hists[name]
            if key not in series:
                series[key] = _Histogram(_LATENCY_BUCKETS)
            series[key].observe(value)

    def value(self, name: str, **labels: Any) -> float:
        """Current value of a counter or gauge series (0 when never touched); for tests."""
        with self._lock:
            return self._values.get(name, {}).get(_labels(labels), 0.0)

    def render(self) -> str:
        """The Prometheus text exposition of every declared family (empty ones with no samples)."""
        lines: list[str] = []
        with self._lock:
            for name, (kind, help_) in FAMILIES.items():
                lines.append(f"# HELP {name} {help_}")
                lines.append(f"# TYPE {name} {kind}")
                if kind == "histogram":
                    for key, h in sorted(self._hists.get(name, {}).items()):
                        for edge, c in zip(h.buckets, h.counts, strict=True):
                            le = ("le", _fmt_value(edge))
                            lines.append(f"{name}_bucket{_fmt_labels(key, le)} {c}")
                        inf = ("le", "+Inf")
                        lines.append(f"{name}_bucket{_fmt_labels(key, inf)} {h.count}")
                        lines.append(f"{name}_sum{_fmt_labels(key)} {_fmt_value(h.sum)}")
                        lines.append(f"{name}_count{_fmt_labels(key)} {h.count}")
                    continue
                for key, v in sorted(self._values.get(name, {}).items()):
                    lines.append(f"{name}{_fmt_labels(key)} {_fmt_value(v)}")
        return "\n".join(lines) + "\n"

    def read_engine(self, engine: Engine) -> None:
        """Copy the engine's gauges (queue depth, batch size, tokens, policy version) into the
        metrics (:class:`clawrl.engine.EngineStats`)."""
        stats = engine.stats
        self.set("clawrl_engine_queue_depth", stats.queue_depth)
        self.set("clawrl_engine_batch_size", stats.batch_size)
        self.set("clawrl_engine_generated_tokens_total", stats.generated_tokens)
        self.set("clawrl_engine_policy_version", engine.policy_version)


class RequestMetricsMiddleware:
    """Pure ASGI middleware: counts requests by route template and status, tracks requests in
    flight and observes latency until the response's last byte (streams included)."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        m = self.metrics
        m.inc("clawrl_gateway_in_flight", 1)
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            m.inc("clawrl_gateway_in_flight", -1)
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            m.inc("clawrl_gateway_requests_total", route=route, status=status["code"])
            m.observe(
                "clawrl_gateway_request_latency_seconds",
                time.perf_counter() - started,
                route=route,
            )
