"""The one spacing between the random streams a run derives from its seed.

Task order per epoch (:mod:`gyre.runtime.tasks`), each cell's engine sampling per weights
version (:mod:`gyre.runtime.cell`) and the standalone engines (:mod:`gyre.runtime.cluster`)
all seed ``seed * SEED_STRIDE + offset``: a prime larger than any offset, so two runs with
different seeds never share a stream.
"""

SEED_STRIDE = 1_000_003
