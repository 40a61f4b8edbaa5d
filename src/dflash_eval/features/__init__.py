"""The target's hidden-state features per prompt, layer and backend/dtype, cached, read lazily and let go after their
consumer."""
