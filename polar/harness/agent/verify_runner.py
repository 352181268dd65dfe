"""The program a code-running verifier starts inside its sandbox (standard library only; polar is not
importable in there). It owns the verdict: it reads a one-time nonce from stdin before any workspace code
runs, creates the verdict file, runs the tests, and writes ``<nonce> <exit code> <how>`` only when the tests
ran to their end. ``how`` is ``completed`` (the file ran to its end), ``exit`` (a ``SystemExit`` raised by
the tests or the standard library, as ``unittest.main()`` does) or ``exit-from-workspace`` (one raised
with workspace code on the stack: never a pass). A solution that calls ``os._exit(0)`` or kills the
runner leaves no verdict at all.

    python -I -B verify_runner.py script  VERDICT WORKDIR TESTS_FILE
    python -I -B verify_runner.py pytest  VERDICT WORKDIR PYTEST_ARGS...
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    return e.code if isinstance(e.code, int) else 1


def _raised_in_workspace(tb: object, workdir: str) -> bool:
    """Whether a frame of the traceback runs workspace code (or code with no file, e.g. exec'd text)."""
    prefix = workdir.rstrip("/") + "/"
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename  # type: ignore[attr-defined]
        if filename.startswith(prefix) or not filename.startswith("/"):
            return True
        tb = tb.tb_next  # type: ignore[attr-defined]
    return False


def main() -> None:
    nonce = sys.stdin.readline().strip()
    mode, verdict_path, workdir, *rest = sys.argv[1:]
    fd = os.open(verdict_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    sys.path.insert(0, workdir)
    how = "completed"
    if mode == "script":
        try:
            runpy.run_path(rest[0], run_name="__main__")
            code = 0
        except SystemExit as e:  # unittest.main() ends this way; a SystemExit from workspace code does not count
            code = _exit_code(e)
            how = "exit-from-workspace" if _raised_in_workspace(e.__traceback__, workdir) else "exit"
        except BaseException:  # a failing test file: its traceback, exit code 1
            traceback.print_exc()
            code = 1
    elif mode == "pytest":
        import pytest

        code = int(pytest.main(rest))
    else:
        raise SystemExit(f"verify_runner: unknown mode {mode!r}")
    os.write(fd, f"{nonce} {code} {how}\n".encode())
    os.close(fd)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
