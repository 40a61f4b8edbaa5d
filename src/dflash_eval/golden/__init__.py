"""The golden folder: the one writer of its records, and which records a run needs and does not have."""
