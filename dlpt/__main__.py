import sys

from dlpt.cli import main

sys.exit(main())
