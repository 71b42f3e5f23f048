"""learned drafters' training."""
