"""Model helpers: the tiny offline model used by tests, quickstart and benchmarks."""
