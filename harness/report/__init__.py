"""From rows to summary to the two renderers (report.md, report.html), speed and compare."""
