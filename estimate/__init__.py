"""dlsub estimate: a short profiling run, its fit per partition, and the recommended shape, time and cost."""
