"""A very small statistics helper package."""

from stats_lite.core import mean, median

__all__ = ["mean", "median"]
