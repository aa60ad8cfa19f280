"""A project-local module imported by cache_a: editing it must re-run alpha's cells."""

SCALE = 2.0
