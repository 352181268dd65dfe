import pytest

from polar.config import load_config
from polar.errors import ConfigError


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_minimal_gymnasium_config_loads(tmp_path):
    cfg = load_config(write(tmp_path, "harness: {type: gymnasium, id: CartPole-v1}\npolicy: {type: ppo, kwargs: {learning_rate: 3e-4}}\n"))
    assert cfg.harness.id == "CartPole-v1"
    assert cfg.policy.kwargs.learning_rate == pytest.approx(3e-4)
    assert cfg.config_dir == tmp_path


def test_unknown_key_names_path_and_suggestion(tmp_path):
    p = write(tmp_path, "harness: {type: gymnasium, id: CartPole-v1}\npolicy: {type: ppo, kwargs: {learnig_rate: 0.1}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "policy.kwargs.learnig_rate" in msg
    assert "learning_rate" in msg


def test_wrong_type_is_reported(tmp_path):
    p = write(tmp_path, "harness: {type: gymnasium, id: CartPole-v1}\npolicy: {type: ppo}\ntotal_env_steps: lots\n")
    with pytest.raises(ConfigError, match="total_env_steps"):
        load_config(p)


def test_override_applies(tmp_path):
    p = write(tmp_path, "harness: {type: gymnasium, id: CartPole-v1}\npolicy: {type: ppo}\n")
    cfg = load_config(p, ["policy.kwargs.gamma=0.5", "seed=7"])
    assert cfg.policy.kwargs.gamma == 0.5 and cfg.seed == 7


def test_malformed_yaml(tmp_path):
    with pytest.raises(ConfigError, match="malformed YAML at line"):
        load_config(write(tmp_path, "harness: {type: [\n"))
