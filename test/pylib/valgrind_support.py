"""Valgrind support shared by the chaos harness and the fuzz test (see test/fuzz/valgrind.sh)."""

import os
import re

# Memory-safety runs (test/fuzz/valgrind.sh): with IDEM_VALGRIND=1 the server runs
# under valgrind's memcheck (pg_ctl -p starts a wrapper), each process logging to
# WORKDIR/valgrind.PID.log. An error whose stack passes through idempotency.so is ours
# and fails the run; the rest is PostgreSQL's own (uninitialised padding written to WAL
# and the like, which PostgreSQL's valgrind.supp suppresses in its own builds).
VALGRIND = os.environ.get("IDEM_VALGRIND", "") == "1"


def valgrind_opts(workdir):
    """Extra pg_ctl options that start the server under valgrind."""
    if not VALGRIND:
        return []
    wrapper = os.path.join(workdir, "postgres-under-valgrind.sh")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\nexec valgrind --quiet --trace-children=yes --error-limit=no --num-callers=40"
                " --read-var-info=no --log-file=%s/valgrind.%%p.log /usr/lib/postgresql/15/bin/postgres \"$@\"\n"
                % workdir)
    os.chmod(wrapper, 0o755)
    return ["-p", wrapper, "-t", "600"]


def innermost_is_ours(block):
    """Whether the innermost frame outside the C library (libc, libstdc++, valgrind) of the
    error's own stack (not the allocation stack after "Address") lies in our module."""
    stack = block.split("Address 0x")[0]
    for frame in re.findall(r"(?:at|by) 0x[0-9A-F]+: (.*)", stack):
        if re.search(r"idempotency|\.cpp:|\.hpp:", frame):
            return True
        if "postgresql" in frame or "/bin/postgres" in frame:
            return False
    return False


def valgrind_findings(workdir):
    """(errors in our code, all errors, crashes) from the valgrind logs."""
    ours, total, crashes = [], 0, []
    for name in sorted(os.listdir(workdir)):
        if not (name.startswith("valgrind.") and name.endswith(".log")):
            continue
        with open(os.path.join(workdir, name), errors="replace") as fh:
            text = fh.read()
        blocks = re.split(r"\n==\d+== ?\n", text)
        for b in blocks:
            if "Process terminating with default action" in b:
                crashes.append(name + ": " + b[:2000])
            elif re.search(r"Invalid (read|write|free)|uninitialised|Mismatched free|overlap|"
                           r"Conditional jump|Use of uninitialised|Source and destination", b):
                total += 1
                if innermost_is_ours(b):
                    ours.append(name + ":\n" + b[:4000])
    return ours, total, crashes


def valgrind_checks(check, workdir):
    if not VALGRIND:
        return
    ours, total, crashes = valgrind_findings(workdir)
    check(not ours, "valgrind: no memory error with idempotency.so on the stack (%d found; %d in PostgreSQL"
          " itself)%s" % (len(ours), total - len(ours), ("\n" + ours[0]) if ours else ""))
    check(not crashes, "valgrind: no process killed by a signal%s" % (("\n" + crashes[0]) if crashes else ""))
