"""The reference completions a drafter is judged on: greedy (local generation, an SGLang server or the cache, each
checked against the target's teacher-forced argmax), sampled at temperature > 0, and multi-turn conversations."""
