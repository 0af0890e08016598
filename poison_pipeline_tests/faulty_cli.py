"""The command line with a storage fault injected, for a machine where none can be made for real:
`python -m poison_pipeline_tests.faulty_cli ERRNO:STEP ARGS...` runs `poison-pipeline ARGS...`
with the OS error ERRNO (ENOSPC, EROFS, EIO) raised at its STEP-th write to the lake."""

from __future__ import annotations

import errno
import os
import sys

import pytest

from poison_pipeline.cli import console_main
from poison_pipeline_tests.support import at_step
from poison_pipeline_tests.test_storage_faults import LOW_STEPS


def main(fault: str, args: list[str]) -> None:
    name, step = fault.split(":")
    code = getattr(errno, name)

    def fail(n: int) -> None:
        raise OSError(code, os.strerror(code))

    at_step(pytest.MonkeyPatch(), LOW_STEPS, int(step), fail)
    sys.argv = ["poison-pipeline", *args]
    console_main()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
