"""One evaluation run in one process: the stages composed in order, the floors and baseline checked against the run's
settings, the result assembled."""
