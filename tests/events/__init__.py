"""Tests for fabro_git.events (a package, so its conftest does not shadow tests/conftest)."""
