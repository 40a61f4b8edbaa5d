"""Small helpers every package uses: atomic writes, normalised paths, dtype names, the torch check, where a run
happened."""
