"""The commands people type: the `dlsub` entry point and its subcommands (click). Nothing imports this package."""
