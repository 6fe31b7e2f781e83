#!/usr/bin/env python3
"""Runs the SQL blocks of Markdown pages and compares what they print with the page.

    mdblocks.py check PAGE... [--mutate-first-output]   (the docs suite, test/suites/docs.sh)
    mdblocks.py static PAGE...                          excerpts and links, no server needed
    mdblocks.py list PAGE...                            what would run, as whom
    mdblocks.py command PAGE TEXT                       the first sh block line holding TEXT
    mdblocks.py output PAGE TEXT                        the output block after that sh block

The conventions a page follows (CONTRIBUTING.md, "Docs that cannot drift"):
  - Every ```sql block runs, in page order, each in a new psql session (psql -X, the block
    on standard input, as a user pastes it), on a fresh database `app` owned by the role
    `app`, on a server whose search_path does not name the extension's schema. A page with
    no block that runs CREATE EXTENSION gets what the README's install section does first:
    CREATE EXTENSION idempotency; GRANT USAGE ON SCHEMA idempotency TO app.
  - A block whose first line is a comment starting "-- as a superuser" runs as `postgres`;
    every other block as `app`.
  - A ```text block that follows a ```sql block (blank lines only between them) is what the
    block prints: psql's standard output and error, compared line by line (trailing spaces
    and leading / trailing blank lines aside). A block without one must print no ERROR.
  - A block that is deliberately not run has the HTML comment <!-- not run: why --> as the
    last line before its fence.
  - A block after <!-- excerpt of PATH --> must appear in the file PATH word for word.
  - Every relative link [..](path#anchor) names a file that exists and, for Markdown
    files, a heading that makes that anchor (GitHub's rule).
Prints one "ok" / "not ok" line per block and ends with "N passed, N failed".
"""
import difflib
import os
import re
import subprocess
import sys

FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
NOT_RUN = re.compile(r"^<!--\s*not run\b.*-->\s*$")
SUPERUSER_ROLE = os.environ.get("DOCS_SUPERUSER", "postgres")
APP_ROLE = os.environ.get("DOCS_ROLE", "app")
APP_DB = os.environ.get("DOCS_DATABASE", "app")


class Block:
    def __init__(self, page, line, lang, text, before):
        self.page, self.line, self.lang, self.text = page, line, lang, text
        self.before = before  # the last non-blank line before the fence
        self.output = None  # the Block showing what this one prints
        self.blank_after = True

    @property
    def not_run(self):
        return bool(NOT_RUN.match(self.before or ""))

    @property
    def role(self):
        first = self.text.lstrip().splitlines()[0] if self.text.strip() else ""
        return SUPERUSER_ROLE if first.lower().startswith("-- as a superuser") else APP_ROLE

    def where(self):
        return "%s:%d" % (self.page, self.line)


def parse(page):
    """The fenced blocks of a page, with each sql block's output block attached."""
    with open(page, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, i, last_text_line = [], 0, None
    gap_since_block = None  # non-blank lines since the previous block closed
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                last_text_line = lines[i].strip()
                if gap_since_block is not None:
                    gap_since_block += 1
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        block = Block(page, start + 1, lang, "\n".join(body) + "\n", last_text_line)
        if lang == "text" and blocks and blocks[-1].lang in ("sql", "psql") and gap_since_block == 0:
            blocks[-1].output = block
        blocks.append(block)
        gap_since_block, last_text_line = 0, None
    return blocks


def normalize(text):
    lines = [line.rstrip() for line in text.replace("\t", "    ").split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def psql(role, database, text):
    """Runs text as a user pastes it into psql; returns (exit code, stdout and stderr)."""
    proc = subprocess.run(["psql", "-X", "-U", role, "-d", database], input=text,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300)
    return proc.returncode, proc.stdout


def admin(sql, database="postgres"):
    code, out = psql(SUPERUSER_ROLE, database, "\\set ON_ERROR_STOP 1\n" + sql)
    if code != 0:
        raise SystemExit("error: could not prepare the database:\n" + out)


def fresh_database(blocks):
    admin("SET client_min_messages = warning;\n"
          "DROP DATABASE IF EXISTS %s WITH (FORCE);\n"
          "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '%s') THEN\n"
          "  CREATE ROLE %s LOGIN; END IF; END $$;\n"
          "CREATE DATABASE %s OWNER %s;\n" % (APP_DB, APP_ROLE, APP_ROLE, APP_DB, APP_ROLE))
    runs_install = any(b.lang in ("sql", "psql") and not b.not_run and
                       re.search(r"CREATE\s+EXTENSION\s+(IF\s+NOT\s+EXISTS\s+)?idempotency", b.text, re.I)
                       for b in blocks)
    if not runs_install:
        admin("CREATE EXTENSION idempotency;\nGRANT USAGE ON SCHEMA idempotency TO %s;\n" % APP_ROLE, APP_DB)


def check(pages, mutate_first_output=False):
    passed = failed = skipped = 0
    for page in pages:
        blocks = parse(page)
        sql = [b for b in blocks if b.lang in ("sql", "psql")]
        if not sql:
            continue
        print("# %s: %d SQL block(s)" % (page, len(sql)))
        fresh_database(blocks)
        mutated = False
        for b in sql:
            if b.not_run:
                skipped += 1
                print("ok - %s # skip %s" % (b.where(), b.before.strip("<!-> ")))
                continue
            code, out = psql(b.role, APP_DB, b.text)
            label = "%s as %s" % (b.where(), b.role)
            problem = None
            if b.output is not None:
                expected = b.output.text
                if mutate_first_output and not mutated:
                    expected, mutated = expected.replace("t", "T", 1), True
                want, got = normalize(expected), normalize(out)
                if want != got:
                    problem = "prints something else than the page shows (%s):\n" % b.output.where() + "\n".join(
                        difflib.unified_diff(want, got, "page", "psql", lineterm=""))
            elif re.search(r"^(psql:.*: )?(ERROR|FATAL|PANIC):", out, re.M) or code != 0:
                problem = "fails (exit %d), and the page shows no output for it:\n%s" % (code, out)
            if problem:
                failed += 1
                print("not ok - %s: %s" % (label, problem.replace("\n", "\n    ")))
            else:
                passed += 1
                print("ok - %s%s" % (label, ", output as shown" if b.output else ""))
    print("# %d skipped (marked not run)" % skipped)
    print("%d passed, %d failed" % (passed, failed))
    return failed == 0


EXCERPT = re.compile(r"^<!--\s*excerpt of\s+(\S+)\s*-->$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page):
    """The anchors GitHub makes for the headings of a Markdown page."""
    seen, out, fenced = {}, set(), False
    with open(page, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if fenced or not m:
                continue
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else "%s-%d" % (slug, n))
    return out


def static(pages):
    """Excerpts and links: one result per page."""
    passed = failed = 0
    for page in pages:
        problems = []
        base = os.path.dirname(page)
        for b in parse(page):
            m = EXCERPT.match(b.before or "")
            if m:
                path = os.path.join(base, m.group(1))
                if not os.path.exists(path) or b.text.strip("\n") not in open(path, encoding="utf-8").read():
                    problems.append("%s: the block is not word for word in %s" % (b.where(), m.group(1)))
        text = open(page, encoding="utf-8").read()
        text = re.sub(r"^(`{3,}).*?^\1", "", text, flags=re.M | re.S)  # no links inside code
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(base, path)) if path else page
            if not os.path.exists(path):
                problems.append("link to a missing file: %s" % target)
            elif anchor and path.endswith(".md") and anchor not in anchors(path):
                problems.append("link to a missing heading: %s" % target)
        if problems:
            failed += 1
            print("not ok - %s: excerpts and links\n    %s" % (page, "\n    ".join(problems)))
        else:
            passed += 1
            print("ok - %s: excerpts and links" % page)
    return passed, failed


def find_sh(page, text):
    for b in parse(page):
        if b.lang in ("sh", "bash", "console") and text in b.text:
            return b
    raise SystemExit("error: no sh block in %s holds %r" % (page, text))


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    cmd, args = argv[1], argv[2:]
    if cmd == "check":
        mutate = "--mutate-first-output" in args
        return 0 if check([a for a in args if not a.startswith("--")], mutate) else 1
    if cmd == "static":
        passed, failed = static(args)
        print("%d passed, %d failed" % (passed, failed))
        return 0 if failed == 0 else 1
    if cmd == "list":
        for page in args:
            for b in parse(page):
                if b.lang in ("sql", "psql"):
                    print("%s %s %s%s" % (b.where(), "not-run" if b.not_run else "run", b.role,
                                          " output@%d" % b.output.line if b.output else ""))
        return 0
    if cmd == "command":
        block = find_sh(args[0], args[1])
        # A command may continue over lines ending in a backslash.
        text = block.text.replace("\\\n", " ")
        for line in text.splitlines():
            if args[1] in line:
                print(re.sub(r"\s+", " ", line.split(" #")[0]).strip())
                return 0
    if cmd == "output":
        blocks = parse(args[0])
        for i, b in enumerate(blocks):
            if b.lang in ("sh", "bash", "console") and args[1] in b.text and i + 1 < len(blocks) \
                    and blocks[i + 1].lang == "text":
                sys.stdout.write(blocks[i + 1].text)
                return 0
        raise SystemExit("error: no text block after an sh block holding %r in %s" % (args[1], args[0]))
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
