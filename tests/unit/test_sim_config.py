"""The simulator's config embeds the policy's: rules declared once, placements say what differs."""

from __future__ import annotations

import pytest

from gyre.policy.config import Placement, PolicyConfig
from gyre.sim.config import SIM_HOLD_TAU_H, PlacementSpec, SimConfig, apply_overrides
from gyre.sim.presets import preset


def test_placements_inherit_the_shared_policy_and_override_only_their_own_fields():
    shared = PolicyConfig(placement=Placement.ELASTIC, cells=4, batch_groups=8, mu=2, rho_min=0.5)
    cfg = SimConfig(
        policy=shared,
        placements={
            "e": PlacementSpec(placement=Placement.ELASTIC),
            "a": PlacementSpec(placement=Placement.ASYNC, phi=0.5, mu=1, async_train_cells=1),
        },
    )
    e, a = cfg.policy_config("e"), cfg.policy_config("a")
    assert e == shared  # nothing overridden: the shared rules as they are
    assert (a.placement, a.phi, a.mu, a.train_cells) == (Placement.ASYNC, 0.5, 1, 1)
    assert (a.cells, a.batch_groups, a.rho_min) == (4, 8, 0.5)  # inherited, not copied fields


def test_a_partial_policy_section_gets_the_simulator_defaults():
    cfg = SimConfig.model_validate({"policy": {"cells": 3}})
    assert cfg.policy.cells == 3 and cfg.policy.hold_tau == SIM_HOLD_TAU_H
    assert SimConfig().policy.hold_tau == SIM_HOLD_TAU_H  # the 2-minute tau, in hours


def test_aliases_reach_the_embedded_policy_and_its_own_checks_apply():
    cfg = apply_overrides(preset("seed-toy"), ["K=4", "B=8", "steps=6", "tau=0.1", "micro=2"])
    p = cfg.policy
    assert (p.cells, p.batch_groups, p.total_steps, p.hold_tau) == (4, 8, 6, 0.1)
    assert p.micro_steps_per_execution == 2
    assert cfg.pool_groups() >= 6 * 8
    with pytest.raises(ValueError, match="cells"):
        apply_overrides(cfg, ["K=0"])
    # a placement that breaks a policy rule is refused when the config is built
    with pytest.raises(ValueError, match="phi \\* B"):
        apply_overrides(cfg, ["placements.elastic.phi=0.3"])
    with pytest.raises(ValueError, match="unknown setting"):
        apply_overrides(cfg, ["cluster.cells=4"])  # the old copied section is gone
