"""One evaluation run in one process: the stages composed in order, the floors and baseline checked against the run's
settings, the reference drafter; and what the run measured as one typed result (eval.json's fields for one process),
assembled from the stages, and the merge of every process's result into eval.json's data."""
