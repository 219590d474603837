#!/bin/sh
# pytorch/extension-cpp's own test suite (test/test_extension.py, unmodified) against
# bench/upstream/extension_cpp: the same three ops written with cuforge.torch.custom_op
# (CUDA kernels compiled by cuforge, CPU kernels in torch), as a cuforge user would port it.
#
#   git clone https://github.com/pytorch/extension-cpp /tmp/extension-cpp
#   pip install expecttest          # torch's TestCase imports it
#   bench/upstream/run_extension_cpp.sh /tmp/extension-cpp/test/test_extension.py
#
# Without a GPU the CUDA tests skip themselves (upstream's skipIf); on a GPU every test runs.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
test_file=${1:?usage: run_extension_cpp.sh path/to/extension-cpp/test/test_extension.py}
PYTHONPATH="$root/src:$here${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m pytest \
    -p no:cacheprovider -q "$test_file"
