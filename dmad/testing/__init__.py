"""Builders for tests and benchmarks (tiny random pipelines). Never imported by the engine."""
