"""``wattclass fleet``: a synthetic fleet of any size from real recordings, for scale benchmarks."""
