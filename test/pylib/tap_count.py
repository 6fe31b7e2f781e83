"""One "ok" / "not ok" line per assertion, and the "N passed, N failed" line the suites count
(test/lib.sh, idem_count_run)."""
import sys

passed = 0
failed = 0


def check(name, condition, detail=""):
    global passed, failed
    if condition:
        passed += 1
        print("ok - " + name)
    else:
        failed += 1
        print("not ok - %s %s" % (name, detail))
    sys.stdout.flush()


def finish():
    """Prints the count and exits: non-zero when an assertion failed."""
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)
