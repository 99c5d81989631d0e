"""The events contract the tests hold every emitted event to: the user's events seed,
parsed (`seed.py`), carried as data (`contract.json`, so the contract holds in a clone
with no seed beside it), and the checks of an event against it (`check.py`).

The product does not read it: it emits the Structs of `fabro_git.events.catalogue`, and
the tests check those, and every event a real run writes, against this contract.
"""
