"""specnb.io."""
