"""Offline datasets: Minari's on-disk format, written and read directly (``polar collect``, offline RL)."""
