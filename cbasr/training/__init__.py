"""Training: the loop (:mod:`~cbasr.training.trainer`) and its tasks (acoustic model, LM),
checkpoints, schedules, distributed runs, fine-tuning, checkpoint averaging and what training
reports. Imports nothing from :mod:`cbasr.inference`."""
