"""specnb.core."""
