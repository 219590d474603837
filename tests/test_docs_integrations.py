"""The Python blocks of the docs pages that build torch extensions (tests/test_readme.py's
:data:`~tests.test_readme.INTEGRATION_PAGES`: docs/torch.md), run as README's blocks are.

They are here, not in tests/test_readme.py, because they build real extensions (the
``# setup.py`` block runs ``python setup.py build_ext --inplace``): `make test` leaves them
out and `make test-integrations` runs them (this file is in the Makefile's
``INTEGRATION_TESTS``).
"""

from __future__ import annotations

import pytest

from tests.test_readme import INTEGRATION_PAGES, block_params, run_block


@pytest.mark.parametrize("code", block_params(INTEGRATION_PAGES))
def test_docs_block_runs(code, tmp_path):
    run_block(code, tmp_path)
