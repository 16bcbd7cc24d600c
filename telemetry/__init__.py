"""Node telemetry: poll GPUs each second, close exact windows, write them durably to Parquet."""
