import pytest

from tests.learning.envs import register


@pytest.fixture(autouse=True, scope="session")
def _learning_envs():
    register()


def train_in_process(tmp_path, data: dict):
    """Validate a config dict and train it in this process; returns (result, trainer)."""
    from polar.config.base import validate
    from polar.config.run import RunConfig
    from polar.trainers.build import compose
    from polar.trainers.run_dir import RunDir

    cfg = validate(RunConfig, data)
    cfg._config_dir = tmp_path
    trainer = compose(cfg, RunDir.create(cfg.name, tmp_path / "run"))
    return trainer.train(), trainer
