"""``python -m clawrl ARGS`` = ``clawrl ARGS``; what torchrun starts on each rank of ``clawrl train``
(``torchrun --nproc-per-node N -m clawrl train --store ... --output-dir ... --method ...``)."""

import sys

from clawrl.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
