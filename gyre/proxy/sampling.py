"""Which sampling parameters reach the engine: the run's (``[proxy.sampling]``) or a harness's.

Why the proxy decides: the behaviour log-prob an engine records is the distribution the tokens
were drawn from only for the settings the run was configured and checked for (``gyre run``
refuses a truncating or tempered distribution unless the log-prob it records is named; see
docs/engine.md, "Sampling semantics"). A harness that sends its own ``top_p=0.9`` would
otherwise change that distribution behind the config's back, so a field the run fixes is sent
on every request and a harness's differing value is overridden (counted, and kept in the trace
record's meta) or refused, never silently mixed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gyre.proxy.config import SamplingConfig
from gyre.proxy.types import Sampling

DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}
"""Every engine's default (SGLang's names): the model's own distribution, uncut. Under it the
raw log-prob a trainer recomputes is exactly the probability the token was drawn with."""


class SamplingRefused(ValueError):
    """A harness asked for a sampling parameter the run fixes to another value (refuse mode)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _top_k(k: int | None) -> int | None:
    return None if k is None else (k if k > 0 else -1)


def engine_sampling(asked: Sampling, run: SamplingConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(params, overridden)``: the distribution fields to send to the engine (only those set
    by the run or the harness; the engine fills the rest with :data:`DEFAULTS`) and the
    harness's values that the run's replaced. Raises :class:`SamplingRefused` in refuse mode."""
    harness = {
        "temperature": asked.temperature,
        "top_p": asked.top_p,
        "top_k": _top_k(asked.top_k),
        "min_p": None,  # no client API carries min_p
    }
    params: dict[str, Any] = {}
    overridden: dict[str, Any] = {}
    for name, mine in harness.items():
        fixed = getattr(run, name)
        if name == "top_k":
            fixed = _top_k(fixed)
        if fixed is None:
            if mine is not None:
                params[name] = mine
            continue
        params[name] = fixed
        if mine is not None and mine != fixed:
            if run.harness_params == "refuse":
                raise SamplingRefused(
                    f"{name}={mine} differs from this run's {name}={fixed} "
                    "(the proxy's sampling.harness_params is 'refuse'); omit it or send the run's",
                    name,
                )
            overridden[name] = mine
    return params, overridden


def effective(params: Mapping[str, Any]) -> dict[str, Any]:
    """The whole distribution a request is sampled from (unset fields at the engine default)."""
    return {k: params.get(k, v) for k, v in DEFAULTS.items()}


def departures(sampling: Mapping[str, Any]) -> list[str]:
    """The fields of a complete sampling dict that make it another distribution than the
    model's own (``["top_p=0.9"]``); empty when raw log-probs are the behaviour policy's."""
    out = []
    for k, v in effective(sampling).items():
        if (_top_k(v) if k == "top_k" else v) != DEFAULTS[k]:
            out.append(f"{k}={v}")
    return out
