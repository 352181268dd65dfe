"""The Ray cluster fixture (``ray_cluster``) lives in ``tests/conftest.py``: tests/trainers and tests/rollout use it too."""
