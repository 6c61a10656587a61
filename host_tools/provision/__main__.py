"""``python3 -m pfcxl.host_tools.provision``: see cli.py."""

import sys

from pfcxl.host_tools.provision.cli import main

if __name__ == "__main__":
    sys.exit(main())
