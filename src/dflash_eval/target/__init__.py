"""The target model: its directory and loaded causal LM, the pieces a drafter borrows, its linear-attention kernel
backends and their probe, hidden-state features and greedy generation."""
