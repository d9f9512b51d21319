"""`python -m keras_elastic.launcher.warm --control_fd=N`: a warm process
(zygote.py). The launcher starts it (pool.py); it is no user command."""

import sys

from keras_elastic.launcher.warm.zygote import main

if __name__ == "__main__":
    main(sys.argv[1:])
