"""What-if (simulate), calibration and the cap-response model (issue 12)."""
