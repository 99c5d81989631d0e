"""Fixtures for the events tests: the seed file itself and its parsed catalogue."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabro_git.events.seed import Catalogue, load_catalogue

# Same location as tests/conftest.py's SHARED: the shared dir next to the checkout.
SEED = Path(__file__).resolve().parents[2].parent / "shared" / "seeds" / "001_3eaf23ec03a7643b.txt"


@pytest.fixture(scope="session")
def seed_path() -> Path:
    assert SEED.is_file(), f"events seed not found at {SEED}"
    return SEED


@pytest.fixture(scope="session")
def catalogue(seed_path: Path) -> Catalogue:
    return load_catalogue(seed_path)
