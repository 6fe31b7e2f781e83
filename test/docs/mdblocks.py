#!/usr/bin/env python3
"""Runs the blocks of Markdown pages and compares what they print with the page.

    mdblocks.py check PAGE... [--mutate-first-output]   run every SQL block (test/suites/docs.sh)
    mdblocks.py static PAGE...                          rendering, markers, excerpts, links
    mdblocks.py config PAGE...                          the postgresql.conf lines of the ini blocks
    mdblocks.py list PAGE...                            every block: what runs it, as whom, where
    mdblocks.py command PAGE TEXT                       the first shell block line holding TEXT
    mdblocks.py output PAGE TEXT                        the text block after that shell block
    mdblocks.py block PAGE TEXT                         the first block holding TEXT, whole
    mdblocks.py columns PAGE HEADING                    first-column names of the first table
                                                        after HEADING (`name` cells)

The conventions a page follows (CONTRIBUTING.md, "Docs that cannot drift"):
  - Every ```sql block runs, in page order, each in a new psql session (psql -X, the block
    on standard input, as a user pastes it), on a server whose search_path does not name the
    extension's schema, configured with the page's ```ini blocks. Each page starts from a
    fresh database `app` owned by the role `app` (a page that creates the role itself, in a
    block, starts without either) and the roles the page creates are dropped first. A page
    with no block that runs CREATE EXTENSION gets the README's install first.
  - The first line of a block says who runs it, and where, when it is a comment:
    "-- as a superuser" runs it as `postgres`, "-- as the role NAME" as NAME, every other
    block as `app`; "in the database NAME" runs it there instead of in `app`.
  - A ```text block that follows a ```sql block (blank lines only between them) is what the
    block prints: psql's standard output and error, compared line by line (trailing spaces
    and leading / trailing blank lines aside). A block without one must print no ERROR.
  - Markers, as the last line before a fence:
      <!-- not run: why -->            the block is deliberately not run
      <!-- run by PATH: how -->         a shell block that the file PATH (of this
                                        repository) runs; every ```sh block has one of the two
      <!-- retried until it prints what is shown, for up to N s: why -->
                                        a SQL block whose output comes true later (a
                                        scheduled job): run again every second until it does
      <!-- excerpt of PATH -->          the block is word for word in the file PATH
  - Every fence is closed, by a line of only the fence (CommonMark): a fence followed by
    text on its line does not close the block, and everything after it renders as code.
  - Every relative link [..](path#anchor) names a file that exists and, for Markdown
    files, a heading that makes that anchor (GitHub's rule).
Prints one "ok" / "not ok" line per block and ends with "N passed, N failed".
"""
import difflib
import os
import re
import subprocess
import sys
import time

OPEN_FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")
NOT_RUN = re.compile(r"^<!--\s*not run\b.*-->$")
RUN_BY = re.compile(r"^<!--\s*run by\s+([^\s:]+)(:.*)?\s*-->$")
RETRIED = re.compile(r"^<!--\s*retried until it prints what is shown, for up to (\d+) s\b.*-->$")
EXCERPT = re.compile(r"^<!--\s*excerpt of\s+(\S+)\s*-->$")
SUPERUSER_ROLE = os.environ.get("DOCS_SUPERUSER", "postgres")
APP_ROLE = os.environ.get("DOCS_ROLE", "app")
APP_DB = os.environ.get("DOCS_DATABASE", "app")
# SQL run as the superuser in the database after every block that creates the extension
# (and after the install a page without one gets): a file name, or nothing.
AFTER_INSTALL = os.environ.get("DOCS_AFTER_INSTALL", "")
# Blocks this server cannot run (a regular expression, say for an extension it lacks), and why.
SKIP = re.compile(os.environ["DOCS_SKIP"]) if os.environ.get("DOCS_SKIP") else None
SKIP_WHY = os.environ.get("DOCS_SKIP_WHY", "")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SQL_LANGS = ("sql", "psql")
SHELL_LANGS = ("sh", "bash", "shell", "console")
INSTALL = re.compile(r"CREATE\s+EXTENSION\s+(IF\s+NOT\s+EXISTS\s+)?idempotency\b", re.I)
CREATE_ROLE = re.compile(r"CREATE\s+(?:ROLE|USER)\s+(\w+)", re.I)


class Block:
    def __init__(self, page, line, lang, text, before):
        self.page, self.line, self.lang, self.text = page, line, lang, text
        self.before = (before or "").strip()  # the last non-blank line before the fence
        self.output = None  # the Block showing what this one prints
        self.closed = True
        self.problems = []  # rendering problems found while parsing

    @property
    def not_run(self):
        return bool(NOT_RUN.match(self.before))

    @property
    def run_by(self):
        m = RUN_BY.match(self.before)
        return m.group(1) if m else None

    @property
    def retry_seconds(self):
        m = RETRIED.match(self.before)
        return int(m.group(1)) if m else 0

    def _first_comment(self):
        first = self.text.lstrip().splitlines()[0] if self.text.strip() else ""
        return first.lower() if first.startswith("--") else ""

    @property
    def role(self):
        first = self._first_comment()
        if first.startswith("-- as a superuser"):
            return SUPERUSER_ROLE
        m = re.match(r"^-- as the role (\w+)", first)
        return m.group(1) if m else APP_ROLE

    @property
    def database(self):
        m = re.search(r"\bin the database (\w+)", self._first_comment())
        return m.group(1) if m else APP_DB

    def where(self):
        return "%s:%d" % (self.page, self.line)


def parse(page):
    """The fenced blocks of a page (CommonMark's fences), each sql block with its output."""
    with open(page, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, i, last_text_line = [], 0, None
    gap_since_block = None  # non-blank lines since the previous block closed
    while i < len(lines):
        m = OPEN_FENCE.match(lines[i])
        if not m or (m.group(1)[0] == "`" and "`" in m.group(2)):  # not a fence: inline code
            if lines[i].strip():
                last_text_line = lines[i].strip()
                if gap_since_block is not None:
                    gap_since_block += 1
            i += 1
            continue
        fence, info, start = m.group(1), m.group(2).strip(), i
        lang = info.split()[0].lower() if info else ""
        # Closed only by a line of at least as many of the same character, and nothing else.
        closing = re.compile(r"^\s*%s{%d,}\s*$" % (re.escape(fence[0]), len(fence)))
        almost = re.compile(r"^\s*%s{%d,}\s*\S" % (re.escape(fence[0]), len(fence)))
        body, problems = [], []
        i += 1
        while i < len(lines) and not closing.match(lines[i]):
            if almost.match(lines[i]):
                problems.append("line %d looks like the end of the block opened at line %d, but text "
                                "follows the fence on that line, so the block goes on" % (i + 1, start + 1))
            body.append(lines[i])
            i += 1
        block = Block(page, start + 1, lang, "\n".join(body) + "\n", last_text_line)
        block.problems = problems
        if i >= len(lines):
            block.closed = False
            block.problems.append("the fence opened at line %d is never closed: the rest of the page "
                                  "renders as code" % (start + 1))
        i += 1  # the closing fence
        if lang == "text" and blocks and blocks[-1].lang in SQL_LANGS and gap_since_block == 0:
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
    code, out = psql(SUPERUSER_ROLE, database, "\\set ON_ERROR_STOP 1\nSET client_min_messages = warning;\n" + sql)
    if code != 0:
        raise SystemExit("error: could not prepare the database:\n" + out)


def after_install(database):
    if AFTER_INSTALL:
        with open(AFTER_INSTALL, encoding="utf-8") as f:
            admin(f.read(), database)


def runs(blocks):
    return [b for b in blocks if b.lang in SQL_LANGS and not b.not_run]


def fresh_database(blocks):
    """The page's starting point: no database app, none of the roles the page creates."""
    created = {r.lower() for b in runs(blocks) for r in CREATE_ROLE.findall(b.text)}
    sql = "DROP DATABASE IF EXISTS %s WITH (FORCE);\n" % APP_DB
    for role in sorted(created):
        sql += ("DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '%s') THEN\n"
                "  DROP OWNED BY %s; DROP ROLE %s; END IF; END $$;\n" % (role, role, role))
    if APP_ROLE not in created:
        sql += ("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '%s') THEN\n"
                "  CREATE ROLE %s LOGIN; END IF; END $$;\n"
                "CREATE DATABASE %s OWNER %s;\n" % (APP_ROLE, APP_ROLE, APP_DB, APP_ROLE))
    admin(sql)
    if APP_ROLE not in created and not any(INSTALL.search(b.text) for b in runs(blocks)):
        admin("CREATE EXTENSION idempotency;\nGRANT USAGE ON SCHEMA idempotency TO %s;\n" % APP_ROLE, APP_DB)
        after_install(APP_DB)


def run_block(b, expected):
    """Runs a block (again, while it is marked retried and prints something else): the problem
    or None, and how many runs it took."""
    deadline = time.monotonic() + b.retry_seconds
    tries = 0
    while True:
        tries += 1
        code, out = psql(b.role, b.database, b.text)
        problem = None
        if expected is not None:
            want, got = normalize(expected), normalize(out)
            if want != got:
                problem = "prints something else than the page shows (%s):\n" % b.output.where() + "\n".join(
                    difflib.unified_diff(want, got, "page", "psql", lineterm=""))
        elif re.search(r"^(psql:.*: )?(ERROR|FATAL|PANIC):", out, re.M) or code != 0:
            problem = "fails (exit %d), and the page shows no output for it:\n%s" % (code, out)
        if problem is None or time.monotonic() >= deadline:
            if INSTALL.search(b.text) and code == 0:
                after_install(b.database)
            return problem, tries
        time.sleep(1)


def check(pages, mutate_first_output=False):
    passed = failed = skipped = 0
    for page in pages:
        blocks = parse(page)
        sql = [b for b in blocks if b.lang in SQL_LANGS]
        if not sql:
            continue
        print("# %s: %d SQL block(s)" % (page, len(sql)))
        fresh_database(blocks)
        mutated = False
        for b in sql:
            if b.not_run or (SKIP and SKIP.search(b.text)):
                skipped += 1
                print("ok - %s # skip %s" % (b.where(), b.before.strip("<!-> ") if b.not_run else SKIP_WHY))
                continue
            expected = b.output.text if b.output is not None else None
            if expected is not None and mutate_first_output and not mutated:
                expected, mutated = expected.replace("t", "T", 1), True
            problem, tries = run_block(b, expected)
            label = "%s as %s in %s" % (b.where(), b.role, b.database)
            if problem:
                failed += 1
                print("not ok - %s: %s" % (label, problem.replace("\n", "\n    ")))
            else:
                passed += 1
                print("ok - %s%s%s" % (label, ", output as shown" if b.output else "",
                                       " (run %d times)" % tries if tries > 1 else ""))
            if mutated:
                break  # the self-test needs no more than the edited block
    print("# %d skipped" % skipped)
    print("%d passed, %d failed" % (passed, failed))
    return failed == 0


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def anchors(page):
    """The anchors GitHub makes for the headings of a Markdown page."""
    seen, out = {}, set()
    code_lines = set()
    for b in parse(page):
        code_lines.update(range(b.line, b.line + b.text.count("\n") + 2))
    with open(page, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if number in code_lines or not m:
                continue
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else "%s-%d" % (slug, n))
    return out


def prose(page, blocks):
    """The page without its code: fenced blocks and inline code spans removed."""
    with open(page, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for b in blocks:
        for n in range(b.line - 1, min(len(lines), b.line + b.text.count("\n") + 1)):
            lines[n] = ""
    return re.sub(r"(`+).+?\1", "", "\n".join(lines))


def static(pages):
    """Rendering, markers, excerpts and links: one result per page."""
    passed = failed = 0
    for page in pages:
        problems = []
        base = os.path.dirname(page)
        blocks = parse(page)
        for b in blocks:
            problems += ["%s: %s" % (b.where(), p) for p in b.problems]
            if not b.lang:
                problems.append("%s: a fence without a language (```text for plain text)" % b.where())
            m = EXCERPT.match(b.before)
            if m:
                path = os.path.join(base, m.group(1))
                if not os.path.exists(path) or b.text.strip("\n") not in open(path, encoding="utf-8").read():
                    problems.append("%s: the block is not word for word in %s" % (b.where(), m.group(1)))
            if b.lang in SHELL_LANGS and not (b.not_run or b.run_by):
                problems.append("%s: a shell block needs <!-- run by PATH: how --> or <!-- not run: why -->"
                                % b.where())
            if b.run_by and not os.path.exists(os.path.join(REPO, b.run_by)):
                problems.append("%s: run by %s, which does not exist" % (b.where(), b.run_by))
            if b.retry_seconds and (b.lang not in SQL_LANGS or b.output is None):
                problems.append("%s: only a SQL block with an output block can be retried" % b.where())
        for target in LINK.findall(prose(page, blocks)):
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
            print("not ok - %s: rendering, markers, excerpts and links\n    %s" % (page, "\n    ".join(problems)))
        else:
            passed += 1
            print("ok - %s: rendering, markers, excerpts and links" % page)
    return passed, failed


def config(pages):
    """postgresql.conf lines of every ini block, the last value of a name winning."""
    settings = {}
    for page in pages:
        for b in parse(page):
            if b.lang != "ini" or b.not_run:
                continue
            for line in b.text.splitlines():
                m = re.match(r"^\s*([\w.]+)\s*=\s*('(?:[^']|'')*'|[^#\s]+)", line)
                if m:
                    settings[m.group(1)] = m.group(2)
    return ["%s = %s" % kv for kv in settings.items()]


def find_block(page, text, langs):
    for b in parse(page):
        if (langs is None or b.lang in langs) and text in b.text:
            return b
    raise SystemExit("error: no block in %s holds %r" % (page, text))


def columns(page, heading):
    """The `name` cells opening the rows of the first table after the heading."""
    with open(page, encoding="utf-8") as f:
        lines = f.read().split("\n")
    start = next((n for n, line in enumerate(lines) if re.match(r"^#+\s+%s\s*$" % re.escape(heading), line)), None)
    if start is None:
        raise SystemExit("error: no heading %r in %s" % (heading, page))
    names, in_table = [], False
    for line in lines[start + 1:]:
        if line.startswith("|"):
            in_table = True
            cells = [c.strip() for c in line.strip("|").split("|")]
            names += re.findall(r"`(\w+)`", cells[0]) if not re.match(r"^-+$", cells[0]) else []
        elif in_table:
            break
    return names


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
    if cmd == "config":
        print("\n".join(config(args)))
        return 0
    if cmd == "list":
        for page in args:
            for b in parse(page):
                if b.lang in SQL_LANGS:
                    how = "not-run" if b.not_run else "run as %s in %s" % (b.role, b.database)
                elif b.lang in SHELL_LANGS:
                    how = "not-run" if b.not_run else "run by %s" % b.run_by
                else:
                    continue
                print("%s %s %s%s" % (b.where(), b.lang, how, " output@%d" % b.output.line if b.output else ""))
        return 0
    if cmd == "command":
        block = find_block(args[0], args[1], SHELL_LANGS)
        # A command may continue over lines ending in a backslash.
        text = block.text.replace("\\\n", " ")
        for line in text.splitlines():
            if args[1] in line:
                print(re.sub(r"\s+", " ", line.split(" #")[0]).strip())
                return 0
    if cmd == "block":
        sys.stdout.write(find_block(args[0], args[1], None).text)
        return 0
    if cmd == "output":
        blocks = parse(args[0])
        for i, b in enumerate(blocks):
            if b.lang in SHELL_LANGS and args[1] in b.text and i + 1 < len(blocks) \
                    and blocks[i + 1].lang == "text":
                sys.stdout.write(blocks[i + 1].text)
                return 0
        raise SystemExit("error: no text block after a shell block holding %r in %s" % (args[1], args[0]))
    if cmd == "columns":
        print("\n".join(columns(args[0], args[1])))
        return 0
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
