"""The guest binding's KVError is translated where the host calls it: a kv command on a file
that holds no store ends in one line and KVStoreError's exit code, never a traceback."""

from __future__ import annotations

import pytest

from pfcxl.errors import KVStoreError

from . import bounded_cli

pytestmark = pytest.mark.component


def test_a_kv_command_on_a_file_that_is_no_store_is_one_line_and_its_exit_code(tmp_path):
    pool = tmp_path / "pool"
    pool.write_bytes(bytes(4 << 20))
    done = bounded_cli.run_named({"stats": ["kv", "stats", "--pool", str(pool)],
                                  "dump": ["kv", "dump", "--pool", str(pool)]})
    for outcome in done.values():
        line = outcome.one_line_error(KVStoreError.exit_code)
        assert "store" in line, line
