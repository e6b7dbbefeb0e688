"""Synthetic harness for scheduling experiments: model calls over a random duration.

``python -m gyre.harness.synthetic --base-url URL/v1 --dist lognormal --mean-s 5400 --time-scale 0.001``

draws a *virtual* duration D from the distribution (seconds; the paper's
executions are ~1.9 h on average with a heavy tail; ``--query-sigma`` adds a
per-query factor shared by all attempts of one task, as in the seed's toy
simulator; ``--max-s`` clips like a harness timeout), then makes ``--calls``
OpenAI chat-completion calls spread evenly over D, sleeping ``gap *
time_scale`` real seconds between them, so an hour-long execution takes a few
real seconds. Each call extends the previous conversation (like an agent loop),
so a proxy sees prefix-sharing requests. Stdlib only: it starts in ~30 ms, which
keeps the executor benchmark about the executor.

``--duration-s D`` (default ``$GYRE_DURATION_S``) skips the draw: the caller
already drew this execution's real duration (``gyre run``'s long-tail workload
draws every execution once, so all placements replay the same numbers). Calls
are then paced against the wall clock (call i at i * D / calls, then a sleep
to D), so call latency is absorbed and the harness ends at D unless its calls
run late; ``--call-every-s`` sets the number of calls from D.

It prints one JSON line at the end: virtual and real duration, calls, errors.
``--write PATH=TEXT`` writes a file into the workspace after the last call
(lets tests and benchmarks produce a scoreable workspace); ``--reply-file PATH``
writes the latest reply after every call (a killed harness leaves its last one).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import time
import urllib.error
import urllib.request

from gyre.harness.calls_file import write_calls_file


def draw_duration(
    rng: random.Random, dist: str, mean_s: float, sigma: float, lo: float, hi: float
) -> float:
    """One virtual duration in seconds, clipped to [lo, hi]."""
    if dist == "fixed":
        d = mean_s
    elif dist == "exponential":
        d = rng.expovariate(1.0 / mean_s)
    elif dist == "uniform":
        d = rng.uniform(lo, hi)
    elif dist == "lognormal":
        # Parameterised by its mean: mu = ln(mean) - sigma^2 / 2.
        d = rng.lognormvariate(math.log(mean_s) - sigma * sigma / 2.0, sigma)
    else:
        raise ValueError(f"unknown distribution {dist!r} (fixed, exponential, uniform, lognormal)")
    return min(max(d, lo), hi)


def _call(url: str, key: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class _Calls:
    """One extending chat call at a time, with the calls file kept current (an attempt is on
    record before it is made, so a harness killed mid-call still counts it) and failures
    counted rather than raised: a synthetic agent, like a real one, carries on."""

    def __init__(self, a: argparse.Namespace, url: str):
        self.a, self.url = a, url
        self.errors, self.last_error = 0, ""

    def make(self, i: int, messages: list[dict]) -> str:
        a = self.a
        write_calls_file(i + 1, i - self.errors, self.last_error)
        try:
            out = _call(
                self.url,
                a.api_key,
                {"model": a.model, "messages": messages, "max_tokens": a.max_tokens},
                a.request_timeout,
            )
            content = (out.get("choices") or [{}])[0].get("message", {}).get("content") or ""
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as e:
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            print(f"call {i} failed: {e}", file=sys.stderr, flush=True)
            content = ""
        write_calls_file(i + 1, i + 1 - self.errors, self.last_error)
        return content


def _write_files(specs: list[str]) -> None:
    """``--write PATH=TEXT``: a scoreable workspace for tests and benchmarks."""
    for spec in specs:
        path, _, text = spec.partition("=")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace("\\n", "\n"))


def _env_float(name: str) -> float | None:
    v = os.environ.get(name, "")
    return float(v) if v else None


def _paced(a: argparse.Namespace) -> int:
    """``--duration-s``: calls at i * D / calls on the wall clock, then sleep to D (real seconds)."""
    t0 = time.monotonic()
    duration = max(0.0, a.duration_s)
    calls = a.calls if a.call_every_s is None else max(1, round(duration / a.call_every_s))
    url = a.base_url.rstrip("/") + "/chat/completions"
    messages = [
        {"role": "system", "content": "You are a synthetic harness."},
        {"role": "user", "content": f"Work for {duration:.1f} seconds."},
    ]
    made = _Calls(a, url)
    for i in range(calls):
        time.sleep(max(0.0, t0 + i * duration / calls - time.monotonic()))
        content = made.make(i, messages)
        if a.reply_file:
            with open(a.reply_file, "w", encoding="utf-8") as f:
                f.write(content)
        messages += [
            {"role": "assistant", "content": content},
            {"role": "user", "content": f"step {i + 1}"},
        ]
    time.sleep(max(0.0, t0 + duration - time.monotonic()))
    _write_files(a.write)
    real = time.monotonic() - t0
    print(
        json.dumps(
            {
                "duration_s": duration,
                "real_s": round(real, 4),
                "calls": calls,
                "errors": made.errors,
            }
        )
    )
    return 1 if calls > 0 and made.errors == calls else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    )
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    ap.add_argument("--model", default="policy")
    ap.add_argument(
        "--dist", default="lognormal", choices=["fixed", "exponential", "uniform", "lognormal"]
    )
    ap.add_argument("--mean-s", type=float, default=5400.0, help="mean virtual duration (seconds)")
    ap.add_argument("--sigma", type=float, default=0.5, help="lognormal shape")
    ap.add_argument("--min-s", type=float, default=0.0)
    ap.add_argument("--max-s", type=float, default=float("inf"))
    ap.add_argument(
        "--time-scale", type=float, default=0.001, help="real seconds per virtual second"
    )
    ap.add_argument("--calls", type=int, default=8, help="model calls over the duration (0: none)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument(
        "--query-sigma",
        type=float,
        default=0.0,
        help="per-query lognormal factor (mean 1) shared by every execution of one task: "
        "queries differ in difficulty, attempts of one query are correlated",
    )
    ap.add_argument(
        "--query-id", default=os.environ.get("GYRE_TASK", ""), help="default: $GYRE_TASK"
    )
    ap.add_argument(
        "--seed", type=int, default=None, help="default: derived from GYRE_EXECUTION_ID"
    )
    ap.add_argument("--write", action="append", default=[], metavar="PATH=TEXT")
    ap.add_argument(
        "--duration-s",
        type=float,
        default=_env_float("GYRE_DURATION_S"),
        help="real duration drawn by the caller (default: $GYRE_DURATION_S); no draw, no scale",
    )
    ap.add_argument(
        "--call-every-s",
        type=float,
        default=_env_float("GYRE_CALL_EVERY_S"),
        help="with --duration-s: one call per this many seconds (at least one), instead of "
        "--calls (default: $GYRE_CALL_EVERY_S)",
    )
    ap.add_argument(
        "--reply-file", default=None, help="write the latest reply here after each call"
    )
    a = ap.parse_args(argv)
    if a.duration_s is not None:
        return _paced(a)

    seed = a.seed
    if seed is None:
        ident = os.environ.get("GYRE_EXECUTION_ID", str(os.getpid()))
        seed = int(hashlib.sha1(ident.encode()).hexdigest()[:8], 16)
    rng = random.Random(seed)
    t0 = time.monotonic()
    factor = 1.0
    if a.query_sigma > 0:
        qrng = random.Random(int(hashlib.sha1(a.query_id.encode()).hexdigest()[:8], 16))
        factor = qrng.lognormvariate(-(a.query_sigma**2) / 2.0, a.query_sigma)
    duration = draw_duration(rng, a.dist, a.mean_s * factor, a.sigma, a.min_s, a.max_s)
    url = a.base_url.rstrip("/") + "/chat/completions"
    messages = [
        {"role": "system", "content": "You are a synthetic harness."},
        {"role": "user", "content": f"Work for {duration:.0f} virtual seconds."},
    ]
    made, gap = _Calls(a, url), (duration / a.calls if a.calls > 0 else duration)
    for i in range(max(a.calls, 0)):
        time.sleep(gap * a.time_scale)
        content = made.make(i, messages)
        messages += [
            {"role": "assistant", "content": content},
            {"role": "user", "content": f"step {i + 1}"},
        ]
    if a.calls <= 0:
        time.sleep(duration * a.time_scale)
    _write_files(a.write)
    print(
        json.dumps(
            {
                "virtual_s": round(duration, 3),
                "query_factor": round(factor, 4),
                "real_s": round(time.monotonic() - t0, 4),
                "calls": a.calls,
                "errors": made.errors,
                "seed": seed,
            }
        ),
        flush=True,
    )
    return 1 if a.calls > 0 and made.errors == a.calls else 0


if __name__ == "__main__":
    sys.exit(main())
