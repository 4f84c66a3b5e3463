"""What one evaluation worker does per second (images/s, clips/s, a probe step), and the paper's two probe
evaluations estimated from those rates: `raystream bench --eval` (raystream/bench/eval_rates.py), runnable here
with its options.

    python benchmarks/eval_extraction.py [--device cpu|cuda] [--threads 1] [--batches 3] [--json PATH]
"""

import sys

from raystream.bench.eval_rates import main

if __name__ == "__main__":
    sys.exit(main())
