"""Collectors: everything that runs the user's program or reads someone else's recording, and
turns it into a `dlpt.profile.Profile`."""
