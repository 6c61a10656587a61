"""`python -m pfcxl.host_tools.cli ...`: the same as the `pfcxl` command."""

import sys

from pfcxl.host_tools.cli.main import main

sys.exit(main())
