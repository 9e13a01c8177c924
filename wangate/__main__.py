import sys

from wangate.cli import main

sys.exit(main())
