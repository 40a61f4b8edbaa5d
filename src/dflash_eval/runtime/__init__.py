"""Process runtime: progress events, timings and counters of one process, and torch's CPU threads set once by the entry
point."""
