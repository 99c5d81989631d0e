"""Fixtures for the events tests: the catalogue the project carries, and the seed page
itself when it is beside the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest
from event_contract.seed import Catalogue, load_contract

# The user's own page, in the shared dir next to the checkout; a clone elsewhere lacks it.
SEED = Path(__file__).resolve().parents[2].parent / "shared" / "seeds" / "001_3eaf23ec03a7643b.txt"


@pytest.fixture(scope="session")
def seed_path() -> Path:
    if not SEED.is_file():
        pytest.skip(f"the events seed is not beside this checkout ({SEED})")
    return SEED


@pytest.fixture(scope="session")
def catalogue() -> Catalogue:
    return load_contract()
