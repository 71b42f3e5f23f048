"""the CPU's fast paths."""
