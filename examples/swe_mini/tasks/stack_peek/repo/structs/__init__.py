"""Tiny data structures."""

from structs.stack import Stack

__all__ = ["Stack"]
