"""What a run needs besides the drafter: the settings, prompts, target directory, tokenizer, prompt ids, the borrowed
head and the floors, checked before any work; and the same inputs seen through another prompt list."""
