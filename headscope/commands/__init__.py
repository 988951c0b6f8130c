"""One module per `headscope` subcommand, each exposing a click command named `cli`."""
