"""Benchmarks of egraph-mirage's own machinery (``egraph-mirage bench ...`` on the command line)."""

from .oracle_bench import KEYS, bench_oracle, format_table

__all__ = ["KEYS", "bench_oracle", "format_table"]
