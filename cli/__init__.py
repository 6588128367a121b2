"""The `seqserve` command line: each subcommand imports its layer lazily, so `serve` never loads torch."""
