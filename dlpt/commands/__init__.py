"""One module per `dlpt` subcommand, each with `register(subparsers)`."""
