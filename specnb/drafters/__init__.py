"""specnb.drafters."""
