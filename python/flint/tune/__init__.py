"""``flint tune``: measures this machine for a model and keeps the settings that a paired
bench shows at least as fast as the defaults (``profile`` holds and loads them)."""

from __future__ import annotations

from flint.tune.profile import Profile, load_profile, profile_path, resolve_engine, save_profile

__all__ = ["Profile", "load_profile", "profile_path", "resolve_engine", "save_profile"]
