import sys

from obelisk_tui.cli import main

sys.exit(main())
