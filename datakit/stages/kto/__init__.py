"""The `kto` stage (`stage.py`: feedback records -> TRL unpaired-preference rows) and the reward
summaries of its output (`report.py`: `_reports/feedback.json`)."""
