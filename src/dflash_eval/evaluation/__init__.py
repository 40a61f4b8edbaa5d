"""One drafter evaluated against the shared earlier stages: its checkpoint read and validated against the target, its
measurements, and hidden-state drift."""
