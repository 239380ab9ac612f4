"""``kvembed eval``: embedding quality on local data, scored by mteb v2 (see :mod:`kvembed.cli.eval`)."""
