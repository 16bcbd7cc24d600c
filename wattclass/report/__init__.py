"""The daily report: one self-contained HTML page from the label store and the telemetry."""
