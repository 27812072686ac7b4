import sys

from bench.soak.soak import main

sys.exit(main())
