"""Migration scripts, oldest first (0001, 0002, ...)."""
