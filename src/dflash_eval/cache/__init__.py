"""The content-addressed on-disk cache of reference completions and target features, and what each entry must hold."""
