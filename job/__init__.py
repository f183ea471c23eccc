"""A job from its user's side: submit (partition choice, shape, directives, settings), the user's job store, status."""
