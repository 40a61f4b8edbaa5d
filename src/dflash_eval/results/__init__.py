"""What a run measured as one typed object (eval.json's fields for one process)."""
