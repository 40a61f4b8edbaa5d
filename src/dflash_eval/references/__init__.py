"""The reference completions a drafter is judged on: greedy (local generation, an SGLang server or the cache, each
checked against the target's teacher-forced argmax), sampled at temperature > 0 (a server's checked against the
target's likelihood), and multi-turn conversations; how the stage reaches a ready server."""
