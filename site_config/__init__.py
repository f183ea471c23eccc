"""The site's policy file (/etc/dlsub/policy.toml): the agent's settings, partitions' prices, budgets and spend."""
