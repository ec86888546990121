"""``python -m clawrl.trainer ARGS`` = ``clawrl train ARGS``: what torchrun starts on each rank
(``torchrun --nproc-per-node N -m clawrl.trainer --store ... --output-dir ... --method ...``)."""

import sys

from clawrl.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
