"""Upstream Iris's Gluon device API under its path: ``from iris.gluon import IrisDeviceCtx``.

The API is :mod:`iris.device.gluon` (the same device ops as Triton kernels, in
``@gluon.jit`` kernels); this module only gives it upstream's import path.

Example:
    >>> from iris.gluon import IrisDeviceCtx, GluonDeviceTracing
"""

from .device.gluon import GluonDeviceTracing, IrisDeviceCtx

__all__ = ["GluonDeviceTracing", "IrisDeviceCtx"]
