"""GPU-cluster scheduling simulator: topology, jobs, network model, event engine, schedulers."""
