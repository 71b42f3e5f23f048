"""specnb.notebook."""
