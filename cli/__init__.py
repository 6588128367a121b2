"""The `seqserve` command line: each subcommand imports its layer lazily, so `serve` never loads torch.

`seqserve serve` installs its SIGTERM/SIGINT handler here, in the first module of ours the command runs (before
cli/main.py, argparse or anything slow is imported): from this instant a signal drains it (server/signals.py).
"""
import sys

if sys.argv[1:2] == ["serve"]:
    from seqserve.server import signals

    signals.hold()
