"""specnb.bench."""
