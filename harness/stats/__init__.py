"""The statistics of a report: intervals, pass/fail tests, ranking, effective length."""
