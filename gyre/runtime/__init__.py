"""The real world on Ray: `gyre run` (loop, world, cells, run directory); see docs/runtime.md."""
