"""The doctor's checks, one module each: its row (key, title, expected text, when it does not apply,
what it needs, its scripts) as ``CHECK`` and its runner. ``doctor/registry.py`` puts them in order."""
