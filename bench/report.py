#!/usr/bin/env python3
"""Aggregates the raw benchmark results of bench/run.sh into tables and goal verdicts.

    report.py latency NAME SYNC REP TPS FAILED LOGFILE...   one TSV line per pgbench run
    report.py claims claims.tsv                             throughput table and goals
    report.py uuid uuid.tsv COUNT INSERTS                   gen_uuid_v7 vs gen_random_uuid
    report.py wal wal.tsv                                   WAL bytes per transaction
    report.py charts OUTDIR RUN [claims.tsv] [scale.tsv]    PNG charts (matplotlib), each
                                                            titled with RUN (which run it shows)
Only ratios within one run are meaningful: every competitor ran on the same machine, in
the same minutes, interleaved.
"""
import statistics
import sys

LABELS = {
    "floor_v7": "bare INSERT ON CONFLICT (v7 key)",
    "floor_rand": "bare INSERT ON CONFLICT (random key)",
    "claim_v7": "claim_key new (v7 key)",
    "claim_rand": "claim_key new (random key)",
    "pl_claim_v7": "PL/pgSQL claim new (v7 key)",
    "inbox": "claim_key+complete_key (1 stmt)",
    "pl_inbox": "PL/pgSQL claim+complete (1 stmt)",
    "inbox_tx": "claim_key+complete_key (BEGIN..COMMIT)",
    "pl_inbox_tx": "PL/pgSQL claim+complete (BEGIN..COMMIT)",
    "floor_pair_txn": "bare INSERT ON CONFLICT + UPDATE by primary key (one transaction; now(): a HOT update)",
    "floor_pair_txn_clock": "the same writes with the completion time (expires_at moves: no HOT update)",
    "inbox_txn": "claim_key, complete_key (two statements, one transaction)",
    "pk_select": "primary-key SELECT (read ceiling; response, response_code)",
    "pk_select_replay": "primary-key SELECT of the replay's columns (status, response, response_code)",
    "pk_select_mismatch": "primary-key SELECT of the mismatch's columns (status, fingerprint)",
    "pk_select_in_progress": "primary-key SELECT of a leased key (status, locked_until)",
    "replay": "claim_key replay",
    "mismatch": "claim_key mismatch",
    "in_progress": "claim_key in_progress",
    "pl_replay": "PL/pgSQL replay (FOR UPDATE)",
    "floor_rand_100": "bare INSERT .. SELECT unnest ON CONFLICT, 100 random keys",
    "claim_keys_rand_100": "claim_keys, 100 new random keys",
    "pk_select_100": "primary-key SELECT .. = ANY, 100 keys",
    "replay_keys_100": "claim_keys, 100 replays",
}


def percentile(sorted_values, fraction):
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def latency(args):
    """pgbench --log lines: client tx_no latency_us script_no epoch epoch_us."""
    name, sync, rep, tps, failed, *files = args
    values = []
    for path in files:
        with open(path) as log:
            for line in log:
                fields = line.split()
                if len(fields) >= 3 and fields[2].isdigit():
                    values.append(int(fields[2]))
    values.sort()
    print("\t".join([name, sync, rep, tps or "nan", failed,
                     "%.0f" % percentile(values, 0.50), "%.0f" % percentile(values, 0.99),
                     str(len(values))]))


def read_claims(path):
    runs = {}
    with open(path) as tsv:
        for line in tsv:
            name, sync, _rep, tps, failed, p50, p99, _n = line.rstrip("\n").split("\t")
            runs.setdefault((name, sync), []).append((float(tps), int(failed), float(p50), float(p99)))
    medians = {}
    for key, values in runs.items():
        medians[key] = {
            "tps": statistics.median(v[0] for v in values),
            "failed": sum(v[1] for v in values),
            "p50": statistics.median(v[2] for v in values),
            "p99": statistics.median(v[3] for v in values),
            "reps": len(values),
        }
    return medians


def verdict(ok):
    return "PASS" if ok else "FAIL"


def claims(args):
    medians = read_claims(args[0])

    def tps(name, sync):
        entry = medians.get((name, sync)) or medians.get((name, "on"))
        return entry["tps"] if entry else float("nan")

    print("Throughput (transactions/s, median) and latency (ms, median of runs' p50 / p99)")
    print("| workload | sync on tx/s | p50 | p99 | sync off tx/s | p50 | p99 | vs floor (on / off) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, label in LABELS.items():
        cells = []
        for sync in ("on", "off"):
            entry = medians.get((name, sync))
            if entry is None:
                cells += ["", "", ""]
            else:
                failed = " (%d failed)" % entry["failed"] if entry["failed"] else ""
                cells += ["%.0f%s" % (entry["tps"], failed), "%.2f" % (entry["p50"] / 1000),
                          "%.2f" % (entry["p99"] / 1000)]
        floor = "floor_rand" if name.endswith("_rand") else "floor_v7"
        ratios = []
        for sync in ("on", "off"):
            if (name, sync) in medians:
                ratios.append("%.2fx" % (medians[(name, sync)]["tps"] / tps(floor, sync)))
        print("| %s | %s | %s |" % (label, " | ".join(cells), " / ".join(ratios)))
    print()
    goals = [
        ("claim of a new key >= 0.85x bare insert (sync off, v7 keys)",
         tps("claim_v7", "off") / tps("floor_v7", "off"), 0.85),
        ("claim of a new key >= 0.85x bare insert (sync off, random keys)",
         tps("claim_rand", "off") / tps("floor_rand", "off"), 0.85),
        ("claim+complete >= 0.8x bare insert (sync on, 1 statement)",
         tps("inbox", "on") / tps("floor_v7", "on"), 0.8),
        ("claim+complete >= 1.8x PL/pgSQL pair (sync on, 1 statement)",
         tps("inbox", "on") / tps("pl_inbox", "on"), 1.8),
        ("replay >= 0.7x primary-key SELECT",
         tps("replay", "on") / tps("pk_select", "on"), 0.7),
        ("replay >= 4x PL/pgSQL replay (sync on)",
         tps("replay", "on") / tps("pl_replay", "on"), 4.0),
    ]
    print("| goal | measured | verdict |")
    print("|---|---:|---|")
    for label, ratio, target in goals:
        print("| %s | %.2fx | %s |" % (label, ratio, verdict(ratio >= target)))
    print()
    print("Also (no goal): claim+complete BEGIN..COMMIT vs bare insert, sync on: %.2fx; vs the "
          "PL/pgSQL pair BEGIN..COMMIT: %.2fx; sync off: %.2fx / %.2fx; claim vs PL/pgSQL claim, "
          "sync off: %.2fx; replay vs PL/pgSQL replay, sync off: %.2fx."
          % (tps("inbox_tx", "on") / tps("floor_v7", "on"),
             tps("inbox_tx", "on") / tps("pl_inbox_tx", "on"),
             tps("inbox_tx", "off") / tps("floor_v7", "off"),
             tps("inbox_tx", "off") / tps("pl_inbox_tx", "off"),
             tps("claim_v7", "off") / tps("pl_claim_v7", "off"),
             tps("replay", "on") / tps("pl_replay", "off")))


def uuid(args):
    path, count, inserts = args[0], int(args[1]), int(args[2])
    generate, insert_time, index_size = {}, {}, {}
    with open(path) as tsv:
        for line in tsv:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "generate":
                generate.setdefault(fields[1], []).append(float(fields[3]))
            else:
                insert_time.setdefault(fields[1], []).append(float(fields[3]))
                index_size.setdefault(fields[1], []).append(int(fields[4]))
    g7, gr = statistics.median(generate["gen_uuid_v7"]), statistics.median(generate["gen_random_uuid"])
    i7, ir = statistics.median(insert_time["gen_uuid_v7"]), statistics.median(insert_time["gen_random_uuid"])
    s7, sr = statistics.median(index_size["gen_uuid_v7"]), statistics.median(index_size["gen_random_uuid"])
    mb = 1024 * 1024
    print("UUIDs (median of runs)")
    print("| | gen_uuid_v7() | gen_random_uuid() | ratio | goal | verdict |")
    print("|---|---:|---:|---:|---|---|")
    print("| count() of %d values: s (us per value) | %.2f (%.3f) | %.2f (%.3f) | %.2fx faster | >= 2.5x | %s |"
          % (count, g7, g7 / count * 1e6, gr, gr / count * 1e6, gr / g7, verdict(gr / g7 >= 2.5)))
    print("| %d primary-key inserts: s | %.2f | %.2f | %.2fx the time | <= 0.6x | %s |"
          % (inserts, i7, ir, i7 / ir, verdict(i7 / ir <= 0.6)))
    print("| primary-key index size: MB | %.1f | %.1f | %.2fx the size | <= 0.8x | %s |"
          % (s7 / mb, sr / mb, s7 / sr, verdict(s7 / sr <= 0.8)))


def wal(args):
    rows = {}
    with open(args[0]) as tsv:
        for line in tsv:
            name, with_fpi, steady = line.rstrip("\n").split("\t")
            rows[name] = (float(with_fpi), float(steady))
    floor = rows["floor_v7"]
    print("WAL bytes per transaction (one client; first run right after a CHECKPOINT, with "
          "full-page images; second run steady state)")
    print("| workload | after CHECKPOINT | ratio | steady | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, (with_fpi, steady) in rows.items():
        print("| %s | %.0f | %.2fx | %.0f | %.2fx |"
              % (LABELS.get(name, name), with_fpi, with_fpi / floor[0], steady, steady / floor[1]))
    ratio = rows["inbox"][1] / floor[1]
    ratio_fpi = rows["inbox"][0] / floor[0]
    print()
    print("| goal | measured | verdict |")
    print("|---|---:|---|")
    print("| WAL per claim+complete <= 1.3x bare insert (steady) | %.2fx | %s |" % (ratio, verdict(ratio <= 1.3)))
    print("| WAL per claim+complete <= 1.3x bare insert (after CHECKPOINT) | %.2fx | %s |"
          % (ratio_fpi, verdict(ratio_fpi <= 1.3)))


def memory(args):
    path, calls = args[0], int(args[1])
    rows = []
    with open(path) as tsv:
        for line in tsv:
            fields = line.rstrip("\n").split("\t")
            if len(fields) == 4:
                rows.append((fields[0], int(fields[1]), int(fields[2]), float(fields[3])))
    kb = 1024
    print("Memory of one backend over %d calls (claim+complete of a new key, replay, mismatch, "
          "in_progress; COMMIT every 500 iterations)" % calls)
    print("| snapshot | memory contexts kB | RssAnon kB | seconds |")
    print("|---|---:|---:|---:|")
    for label, contexts, rss, secs in rows:
        print("| %s | %d | %d | %.0f |" % (label, contexts / kb, rss / kb, secs))
    first, half, last = rows[0], rows[1], rows[-1]
    # A leak grows with the number of calls, so it shows in the second half as much as in
    # the first; a one-time growth (caches filling) shows only before the half-way mark.
    growth_ctx, growth_rss = last[1] - half[1], last[2] - half[2]
    per_call = max(growth_ctx, growth_rss, 0) / (calls / 2.0)
    ok = growth_ctx < 256 * 1024 and growth_rss < 1024 * 1024
    print()
    print("| goal | measured | verdict |")
    print("|---|---:|---|")
    print("| backend memory flat over %d calls (second half: contexts < 256 kB, RssAnon < 1 MB growth) "
          "| contexts %+d kB, RssAnon %+d kB (whole run: %+d kB, %+d kB); at most %.3f bytes per call | %s |"
          % (calls, growth_ctx / kb, growth_rss / kb, (last[1] - first[1]) / kb,
             (last[2] - first[2]) / kb, per_call, verdict(ok)))
    if rows[-1][3] > 0:
        print("(%.1f us per call in the loop)" % (rows[-1][3] / calls * 1e6))


def scale(args):
    path, seconds = args[0], args[1]
    rows = []
    with open(path) as tsv:
        for line in tsv:
            source, step, tps, count, heap, pkey, expires, shared_buffers = line.rstrip("\n").split("\t")
            rows.append((source, float(step), float(tps or "nan"), int(count), int(heap), int(pkey),
                         int(expires), shared_buffers))
    mb = 1024 * 1024
    print("Scale curve: claims of new keys (8 clients, synchronous_commit off, median of 3 x %ss per step) as "
          "idempotency_keys grows; shared_buffers = %s" % (seconds, rows[0][7] if rows else "?"))
    print("| keys | rows after | claims/s | vs first step | heap MB | primary key MB | expires_at index MB | bytes/row (all) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    first = {}
    for source, step, tps, count, heap, pkey, expires, _ in rows:
        first.setdefault(source, tps)
        label = "%s %gM" % ("gen_uuid_v7()" if source == "v7" else "random text", step)
        print("| %s | %d | %.0f | %.2fx | %.0f | %.0f | %.0f | %.0f |"
              % (label, count, tps, tps / first[source], heap / mb, pkey / mb, expires / mb,
                 (heap + pkey + expires) / max(count, 1)))


def instructions(args):
    rows = {}
    with open(args[0]) as tsv:
        for line in tsv:
            name, count = line.rstrip("\n").split("\t")
            rows[name] = int(count)
    print("CPU instructions per transaction inside the server (callgrind, single-user backend, "
          "prepared statement; no client, no network; synchronous_commit off)")
    print("| workload | instructions | vs floor | vs second floor | vs PL/pgSQL |")
    print("|---|---:|---:|---:|---:|")
    rival = {"claim_v7": "pl_claim_v7", "inbox": "pl_inbox", "replay": "pl_replay"}
    # Each read against the primary-key SELECT of the same columns (the floor), and against
    # the two-column pk_select of earlier tables (the second floor); the claim + complete pair
    # against the same writes with the completion time (the floor: expires_at moves, as the
    # SPEC requires) and against the hand-written pair with now() (HOT: expires_at unchanged).
    same_columns = {"replay": "pk_select_replay", "pl_replay": "pk_select_replay", "mismatch": "pk_select_mismatch",
                    "in_progress": "pk_select_in_progress"}
    for name, count in rows.items():
        floor = rows.get("floor_rand" if name.endswith("_rand") else "floor_v7")
        second = None
        if name.startswith("pk_select") or name in ("replay", "mismatch", "in_progress", "pl_replay"):
            floor = rows.get(same_columns.get(name, name), rows.get("pk_select"))
            if name in same_columns and name != "pl_replay":
                second = rows.get("pk_select")
        if name in ("inbox_txn", "floor_pair_txn"):
            floor = rows.get("floor_pair_txn_clock", floor)
            if name == "inbox_txn":
                second = rows.get("floor_pair_txn")
        if name == "floor_pair_txn_clock":
            floor = count
        if name.endswith("_100"):  # batches of 100 keys in one call: the batched floors
            floor = rows.get("pk_select_100" if "select" in name or "replay" in name else "floor_rand_100")
        versus = "%.2fx" % (count / rows[rival[name]]) if name in rival and rival[name] in rows else ""
        print("| %s | %d | %.2fx | %s | %s |" % (LABELS.get(name, name), count, count / floor,
                                                "%.2fx" % (count / second) if second else "", versus))
    print("(reads compare with the primary-key SELECT, writes with the bare insert; below 1 = cheaper)")


def profile(args):
    """perf report --children / --no-children text: inclusive shares of stages, self top."""
    children_path, self_path, *symbols = args
    inclusive = {}
    with open(children_path) as report:
        for line in report:
            fields = line.split()
            if len(fields) >= 4 and fields[0].endswith("%") and fields[2] == "[.]":
                tail = fields[3:]
                while tail and tail[-1] == "-":
                    tail.pop()
                name = " ".join(tail)
                inclusive.setdefault(name, (float(fields[0][:-1]), float(fields[1][:-1])))
    rows = [(name, inclusive[name]) for name in symbols if name in inclusive]
    ours = sorted(((name, value) for name, value in inclusive.items() if "idem::" in name),
                  key=lambda item: -item[1][0])[:12]
    print("| function (inclusive %, self %) | |")
    print("|---|---:|")
    for name, (total, own) in rows + ours:
        short = name.replace("(anonymous namespace)::", "")
        if len(short) > 90:
            short = short[:87] + "..."
        print("| %s | %.1f%% (%.1f%%) |" % (short, total, own))
    top = []
    with open(self_path) as report:
        for line in report:
            fields = line.split()
            if len(fields) >= 4 and fields[0].endswith("%"):
                tail = fields[3:]
                while tail and tail[-1] == "-":
                    tail.pop()
                top.append("%s %s (%s)" % (fields[0], " ".join(tail)[:60], fields[1]))
            if len(top) == 12:
                break
    print("Top self: " + "; ".join(top))


def charts(args):
    """throughput.png from claims.tsv and scale.png from scale.tsv, each titled with the run."""
    import os
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import textwrap
    outdir, paths = args[0], args[2:]
    run = "\n".join(textwrap.wrap(args[1], 90))
    written = []
    for path in paths:
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            continue
        name = os.path.basename(path)
        if "claims" in name:
            medians = read_claims(path)
            names = [n for n in LABELS if (n, "on") in medians or (n, "off") in medians]
            fig, ax = plt.subplots(figsize=(9, 0.42 * len(names) + 1.6))
            height = 0.38
            for offset, sync, color in ((-height / 2, "on", "#4c72b0"), (height / 2, "off", "#dd8452")):
                values = [medians[(n, sync)]["tps"] if (n, sync) in medians else 0 for n in names]
                ax.barh([i + offset for i in range(len(names))], values, height,
                        label="synchronous_commit = %s" % sync, color=color)
            ax.set_yticks(range(len(names)))
            ax.set_yticklabels([LABELS[n] for n in names], fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel("transactions per second (median of runs; 8 clients)")
            ax.set_title("idempotency: throughput per workload\n%s" % run, fontsize=9)
            ax.legend(fontsize=8, loc="lower right")
            ax.grid(axis="x", alpha=0.3)
            target = os.path.join(outdir, "throughput.png")
        elif "scale" in name:
            series = {}
            with open(path) as tsv:
                for line in tsv:
                    fields = line.rstrip("\n").split("\t")
                    if len(fields) >= 3 and fields[2]:
                        series.setdefault(fields[0], []).append((float(fields[1]), float(fields[2])))
            fig, ax = plt.subplots(figsize=(7, 4))
            for source, points in sorted(series.items()):
                label = "gen_uuid_v7() keys" if source == "v7" else "random text keys"
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
            ax.set_xscale("log")
            steps = sorted({p[0] for points in series.values() for p in points})
            ax.set_xticks(steps)
            ax.set_xticklabels(["%gM" % step for step in steps])
            ax.minorticks_off()
            ax.set_ylim(bottom=0)
            ax.set_xlabel("keys in idempotency_keys (millions, log scale)")
            ax.set_ylabel("claims of new keys per second")
            ax.set_title("idempotency: claim rate as the table grows\n%s" % run, fontsize=9)
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
            target = os.path.join(outdir, "scale.png")
        else:
            continue
        fig.tight_layout()
        fig.savefig(target, dpi=110)
        plt.close(fig)
        written.append(target)
    print("charts: %s" % (", ".join(written) if written else "none (no claims or scale results)"))


if __name__ == "__main__":
    {"charts": charts, "latency": latency, "claims": claims, "uuid": uuid, "wal": wal, "memory": memory,
     "scale": scale, "profile": profile, "instructions": instructions}[sys.argv[1]](sys.argv[2:])
