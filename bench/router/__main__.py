import sys

from bench.router.bench import main

sys.exit(main())
