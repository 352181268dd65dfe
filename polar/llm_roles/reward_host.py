"""Runs INSIDE the sandbox: loads one candidate reward file and answers reward queries over stdin/stdout.

Standard library only, started with ``python -I``. Protocol: one JSON object per line in
(``obs``, ``action``, ``next_obs``, ``terminated``, ``truncated``), one line out: ``{"reward": float}``
or ``{"error": "..."}`` (after which the host exits). Never imported by polar."""

import json
import sys
import traceback


def main() -> int:
    path = sys.argv[1]
    namespace: dict = {"__name__": "candidate"}
    out = sys.stdout
    sys.stdout = sys.stderr  # prints of the candidate never mix with the protocol
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        exec(compile(source, "candidate.py", "exec"), namespace)
        fn = namespace.get("compute_reward")
        if not callable(fn):
            raise NameError("the candidate defines no function compute_reward(obs, action, next_obs, terminated, truncated)")
    except BaseException as e:
        out.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
        out.flush()
        return 1
    for line in sys.stdin:
        try:
            q = json.loads(line)
            r = float(fn(q["obs"], q["action"], q["next_obs"], q["terminated"], q["truncated"]))
            if r != r or r in (float("inf"), float("-inf")):
                raise ValueError(f"compute_reward returned {r}")
        except BaseException as e:
            tb = traceback.format_exc(limit=3)[-600:]
            out.write(json.dumps({"error": f"{type(e).__name__}: {e}", "traceback": tb}) + "\n")
            out.flush()
            return 1
        out.write(json.dumps({"reward": r}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
