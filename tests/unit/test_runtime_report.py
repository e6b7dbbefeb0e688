"""The run report's figures that are read back from the cells' own records."""

from __future__ import annotations


def test_the_prefix_cache_figures_of_a_run_sum_the_engines_switch_records(tmp_path):
    """report.prefix_cache reads what each rollout phase's engine said when it left (the
    cell's switch record) or when the run ended (``engine_phase``): hits and misses per
    admitted prompt, tokens served and prefilled."""
    import json

    from gyre.runtime.report import prefix_cache
    from gyre.runtime.rundir import RunDir

    rd = RunDir(tmp_path)
    rd.logs.mkdir(parents=True)
    assert prefix_cache(rd) == {}  # no engine reported: nothing to say
    rows = [
        {"event": "switch", "to": "rollout"},  # arriving: no counts
        {
            "event": "switch",
            "to": "training",
            "engine": {
                "prefix_cache_hits": 3,
                "prefix_cache_misses": 1,
                "prefix_cache_hit_tokens": 600,
                "prefill_tokens": 200,
            },
        },
        {"event": "microstep.done", "engine": {"prefix_cache_hits": 99}},  # not a switch
    ]
    (rd.logs / "cell-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (rd.logs / "cell-2.jsonl").write_text(
        json.dumps(
            {
                "event": "engine_phase",  # serving when the run ended (an Async rollout cell)
                "engine": {
                    "prefix_cache_hits": 1,
                    "prefix_cache_misses": 3,
                    "prefix_cache_hit_tokens": 0,
                    "prefill_tokens": 200,
                },
            }
        )
        + "\n{torn"
    )
    got = prefix_cache(rd)
    assert got == {
        "engine_phases": 2,
        "hits": 4,
        "misses": 4,
        "hit_tokens": 600,
        "prefill_tokens": 400,
        "hit_rate": 0.5,
        "token_share": 0.6,
    }
