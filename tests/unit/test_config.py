import pytest
from pydantic import ValidationError

from gyre.config import GyreConfig, apply_overrides, load_config
from gyre.policy.config import PolicyConfig


def test_model_dir_is_shared_unless_a_section_names_its_own(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text(
        'model_dir = "/m"\n[proxy]\nmodel_dir = "/tok"\nport = 9000\n[policy]\nplacement = "colocate"\nmu = 4\n'
    )
    cfg = load_config(f)
    assert cfg.engine.model_dir == "/m" and cfg.trainer.model_dir == "/m"
    assert cfg.proxy.model_dir == "/tok" and cfg.proxy.port == 9000
    assert cfg.policy.placement.value == "colocate" and cfg.policy.mu == 4


def test_overrides_parse_json_values_and_reach_nested_sections():
    cfg = load_config(
        model_dir="/m",
        overrides=[
            "policy.cells=4",
            "trainer.objective.token_cap=3.5",
            "proxy.mode=managed",
            "proxy.admin_token=secret",
        ],
    )
    assert cfg.policy.cells == 4
    assert cfg.trainer.objective.token_cap == 3.5
    assert cfg.proxy.mode == "managed"


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="section.field=value"):
        apply_overrides({}, ["no-equals-sign"])
    with pytest.raises(ValidationError, match="cells"):
        load_config(model_dir="/m", overrides=["policy.cells=0"])
    with pytest.raises(ValidationError, match="policy"):
        load_config(model_dir="/m", overrides=["policy.nonsense=1"])
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ValidationError, match="model_dir"):
        GyreConfig.model_validate({})


def test_batch_size_is_declared_once_in_the_policy():
    """B lives in [policy]; the trainer's stream follows it, and a second, different B is refused."""
    cfg = load_config(model_dir="/m", overrides=["policy.batch_groups=6"])
    assert cfg.policy.batch_groups == cfg.trainer.stream.batch_groups == 6
    cfg = load_config(
        model_dir="/m", overrides=["policy.batch_groups=6", "trainer.stream.batch_groups=6"]
    )
    assert (
        cfg.trainer.stream.batch_groups == 6
    )  # saying it twice, equal, is fine (config.toml round trip)
    with pytest.raises(ValidationError, match="set B once"):
        load_config(
            model_dir="/m", overrides=["policy.batch_groups=6", "trainer.stream.batch_groups=4"]
        )
    # the policy's default B counts too: a stream B alone cannot drift from it
    default_b = PolicyConfig.model_fields["batch_groups"].default
    with pytest.raises(ValidationError, match="set B once"):
        load_config(model_dir="/m", overrides=[f"trainer.stream.batch_groups={default_b + 1}"])
    with pytest.raises(ValidationError, match="set B once"):
        load_config(
            model_dir="/m",
            overrides=["policy.placement=colocate", f"trainer.stream.batch_groups={default_b + 1}"],
        )
    # a config dumped by a run loads back with the same B
    again = GyreConfig.model_validate(cfg.model_dump(mode="json"))
    assert again.trainer.stream.batch_groups == again.policy.batch_groups == 6
