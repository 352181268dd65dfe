"""Evaluation suites: ``polar eval --suite FILE`` (docs/evaluation.md).

``suite`` is the YAML schema, ``wrappers`` the robustness wrappers, ``metrics`` the metric plug-ins,
``policies`` loads checkpoints and ensembles, ``episodes`` / ``agents`` run env episodes and agent sessions,
``runner`` runs the (harness, policy) jobs in parallel processes, ``report`` writes report.json/.md/.html.
"""
