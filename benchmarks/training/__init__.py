"""The trainer: run times, the penalty weight against the batch, toy tuning, multi-process cost."""
