"""One typed configuration for a whole Gyre run: the public name of
:class:`gyre.runtime.config.GyreConfig` and its loader.

Each package owns its section's model (policy, engine, proxy, trainer, executor, run); the
runtime composes them (``gyre run`` is the one command that needs them all), so a controller or
a Ray actor gets exactly the object its package defines and nothing is configured twice. Files
and ``--set`` overrides are read by :mod:`gyre.config_io`, which ``gyre proxy`` and ``gyre
engine`` share.
"""

from __future__ import annotations

from gyre.config_io import apply_overrides, load_section
from gyre.runtime.config import GyreConfig, load_config

__all__ = ["GyreConfig", "apply_overrides", "load_config", "load_section"]
