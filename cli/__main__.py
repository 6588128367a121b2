"""`python -m seqserve.cli ...` is the `seqserve` command."""
import sys

from seqserve.cli.main import main

sys.exit(main())
