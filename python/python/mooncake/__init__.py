"""Mooncake Python package.

Conductor support lives in :mod:`mooncake.conductor`; it is not imported here so that
``import mooncake`` works in installations built without the native Conductor extension.
"""
