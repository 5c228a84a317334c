"""Benchmark harness: registry, loaders, graders, runner, reports."""
