"""Options for the whole suite: `--kernels LIST` runs the kernel matrix
(tests/integration/test_kernel_matrix.py) on each kernel of the list; without it that module is
not collected (it boots every check once per kernel: `make test-kernels`, not `make test`)."""

from __future__ import annotations

from pathlib import Path

MATRIX = Path(__file__).parent / "integration" / "test_kernel_matrix.py"


def pytest_addoption(parser) -> None:
    parser.addoption("--kernels", metavar="LIST", default=None,
                     help="run the kernel matrix on these kernels, comma-separated: default (setup's 6.12), a "
                     "Debian version or latest (--kernel-package), or a path: a build tree, or FILE:MODULES_DIR")


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    if collection_path == MATRIX and config.getoption("kernels") is None:
        return True
    return None


def pytest_generate_tests(metafunc) -> None:
    if "matrix_kernel" in metafunc.fixturenames:
        specs = [s.strip() for s in metafunc.config.getoption("kernels").split(",") if s.strip()]
        metafunc.parametrize("matrix_kernel", specs, ids=specs)
