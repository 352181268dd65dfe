"""Agent harnesses (``harness: {type: agent}``): runners, coding-CLI presets, the sandbox, verifiers, tasks.

A regular package (not a namespace one), so it is installed from a wheel and the import-layer check sees it.
"""
