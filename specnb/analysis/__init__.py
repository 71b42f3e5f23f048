"""specnb.analysis."""
