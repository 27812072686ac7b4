import sys

from bench.planner.bench import main

sys.exit(main())
