"""the sweeps and studies the notebooks run."""
