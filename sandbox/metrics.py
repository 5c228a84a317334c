"""Counters for /metrics in the Prometheus text format (no client library needed for this handful)."""

from __future__ import annotations

from collections import Counter

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class PoolMetrics:
    def __init__(self) -> None:
        self.calls = Counter()
        self.buckets = [0] * (len(BUCKETS) + 1)
        self.latency_sum = 0.0
        self.latency_count = 0
        self.zygote_restarts = 0

    def observe(self, status: str, seconds: float) -> None:
        self.calls[status] += 1
        self.latency_sum += seconds
        self.latency_count += 1
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1
                return
        self.buckets[-1] += 1

    def render(self, *, waiting: int, running: int, workers: int) -> str:
        lines = [
            "# HELP rstar_sandbox_calls_total Calls answered, by result status.",
            "# TYPE rstar_sandbox_calls_total counter",
        ]
        for status, count in sorted(self.calls.items()):
            lines.append(f'rstar_sandbox_calls_total{{status="{status}"}} {count}')
        lines += [
            "# HELP rstar_sandbox_call_seconds Time from submission to answer.",
            "# TYPE rstar_sandbox_call_seconds histogram",
        ]
        cumulative = 0
        for bound, count in zip(BUCKETS, self.buckets):
            cumulative += count
            lines.append(f'rstar_sandbox_call_seconds_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'rstar_sandbox_call_seconds_bucket{{le="+Inf"}} {self.latency_count}')
        lines.append(f"rstar_sandbox_call_seconds_sum {self.latency_sum:.6f}")
        lines.append(f"rstar_sandbox_call_seconds_count {self.latency_count}")
        for name, help_text, value in (
            ("queue_waiting", "Calls waiting for a worker.", waiting),
            ("running", "Cells running now.", running),
            ("workers", "Cells that may run at once.", workers),
            ("zygote_restarts_total", "Times the zygote was started again after dying.", self.zygote_restarts),
        ):
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# HELP rstar_sandbox_{name} {help_text}", f"# TYPE rstar_sandbox_{name} {kind}",
                      f"rstar_sandbox_{name} {value}"]
        return "\n".join(lines) + "\n"
