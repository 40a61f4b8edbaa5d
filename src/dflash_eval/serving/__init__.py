"""The suite's side of an SGLang server: how the references stage reaches a ready server, and the local target's checks
of what a server answers (greedy completions by teacher-forced argmax, sampled ones by likelihood) before anything is
cached."""
