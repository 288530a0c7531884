"""What the step-time model runs on: models, GPUs and clusters, and the training frameworks' profiles
(what each framework runs per step), by name or from a file (``ccoverlap list``)."""
