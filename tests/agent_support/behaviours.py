"""One harness program, many behaviours (chosen by argv[1]); the bad-input tests run each as a session."""

import os
import sys
import time

from openai import OpenAI


def ask(api_key=None):
    client = OpenAI(api_key=api_key or os.environ["OPENAI_API_KEY"], max_retries=0, timeout=60)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": sys.stdin.read() or "hi"}], max_tokens=8)
    return r.choices[0].message.content or ""


def main():
    what = sys.argv[1]
    if what == "ok":
        print(ask())
    elif what == "exit_nonzero":
        ask()
        sys.stderr.write("boom: the agent crashed\n")
        sys.exit(3)
    elif what == "no_calls":
        print("42")
    elif what == "wrong_key":
        print(ask(api_key="not-the-session-key"))
    elif what == "big_output":
        chunk = "x" * 65536
        while True:
            sys.stdout.write(chunk)
    elif what == "forker":
        ask()
        pid_file = os.environ["PID_FILE"]
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                with open(pid_file, "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(300)
            os._exit(0)
        os.wait()
        for _ in range(200):  # wait until the grandchild wrote its pid, then exit leaving it behind
            if os.path.exists(pid_file) and open(pid_file).read():
                break
            time.sleep(0.05)
        print("done")
    elif what == "slow":
        ask()
        time.sleep(300)
    else:
        sys.exit(f"unknown behaviour {what}")


if __name__ == "__main__":
    main()
