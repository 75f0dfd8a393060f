import sys

from mdd.cli import main

sys.exit(main())
