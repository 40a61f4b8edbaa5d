"""Small helpers every package uses: atomic writes, normalised paths, dtype names, the torch check, where a run
happened; and the process's runtime: progress events, timings and counters, torch's CPU threads set once by the entry
point, the third-party libraries' output handled alike in every command."""
