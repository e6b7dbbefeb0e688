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


def test_the_end_of_a_run_clears_the_snapshots_and_counts_the_disk_by_part(tmp_path):
    """``RunDir.clear_snapshots`` removes the satellites' snapshot files (not the folder, a
    resumed run writes into it) and returns their bytes; ``disk_bytes`` then counts what
    stays, by part, with the snapshots apart from the published weights."""
    from gyre.runtime.report import disk_bytes
    from gyre.runtime.rundir import RunDir

    rd = RunDir(tmp_path).create()
    for name, size in (("v5.safetensors", 300), ("v6.safetensors", 300)):
        (tmp_path / "weights" / "snapshots" / name).write_bytes(b"s" * size)
    (tmp_path / "weights" / "v6").mkdir()
    (tmp_path / "weights" / "v6" / "model.safetensors").write_bytes(b"w" * 200)
    (tmp_path / "checkpoints" / "step-6").mkdir()
    (tmp_path / "checkpoints" / "step-6" / "optimizer.pt").write_bytes(b"o" * 50)
    before = disk_bytes(rd)
    assert (before["snapshots"], before["published_weights"], before["checkpoints"]) == (
        600, 200, 50,
    )  # fmt: skip
    assert rd.clear_snapshots() == 600
    after = disk_bytes(rd)
    assert after["snapshots"] == 0 and after["total"] == before["total"] - 600
    assert (tmp_path / "weights" / "snapshots").is_dir()
    assert rd.clear_snapshots() == 0
