"""Shared fixtures: small models and bundles are built once per session."""
from __future__ import annotations
