"""``bench``: the main job. ``asv run`` on a bounded sample of main's commits that can change a result (benchmark
files come from the working tree: only RESULT_PATHS can), main~1's timings again beside main's, the answers suite at
main, ``asv publish``, a summary, the answers measured here beside the README's. Exit 2 when a point failed at main
or vanished since main~1; 1 on an error.
"""

import math
import os
import shlex
import time

from .. import common, publish, results
from .gate import (DEFAULT_FACTOR, UNPAIRED_FACTOR, asv_compare, exact_regressions, failures, method_of,
                   pair, print_failures, ratio_text)

LOCKS_WORKSPACE = True
RESULT_PATHS = ["kv_attention", "setup.cfg", "pyproject.toml", "asv.conf.json"]
SUITES = ["benchmarks", "answers"]  # from the working tree
BUILD_FILES = ["setup.cfg", "pyproject.toml", "kv_attention/__init__.py"]  # all present => buildable
DEFAULT_COMMITS = 5
NEWEST = 2  # main and main~1: always in the sample
# Seconds at load 1, 2-core AMD VM (7 December 2026), times (load / cores) ** 0.7 (runs at load 1 and 3): a commit's
# suite; main's or main~1's without timings and peak RSS; both those side by side; answers; first env; publish; a pair.
SECONDS_PER_COMMIT, UNTIMED, BESIDE, ANSWERS, FIRST_ENV, PUBLISH, PER_PAIRED_POINT = 80, 36, 165, 75, 30, 5, 8
NAMED = 5  # points named under the summary, per channel
# asv --bench patterns: what moves between runs of identical code (timings, peak RSS), measured side by side; the rest
SIDE_BY_SIDE, ALONE = r"\.(time|peakmem)_", r"^(?!.*\.(time|peakmem)_)"
COMMITS = common.checked(int, lambda n: n >= 2, "an integer of at least 2 (main and main~1)")


def setup_arguments(subparsers):
    parser = subparsers.add_parser("bench", allow_abbrev=False, help="benchmark a bounded sample of the commits of "
                                   "main that can change a result, publish, summarise")
    parser.add_argument("--commits", type=COMMITS, default=DEFAULT_COMMITS, metavar="N",
                       help=f"at most N commits: main, main~1, the newest that can change a result and older ones "
                            f"spread over the history (default {DEFAULT_COMMITS})")
    return parser


def select_commits(bound):
    """Commits of main's first-parent history (as asv graphs it) to benchmark, newest first, each buildable: main,
    main~1 and those that changed a path of RESULT_PATHS, at most ``bound`` (:func:`sample_commits`)."""
    head = common.git("rev-list", "--first-parent", "--max-count=2", common.BRANCH).split()
    changing = common.git("rev-list", "--first-parent", common.BRANCH, "--", *RESULT_PATHS).split()
    commits = [c for c in dict.fromkeys(head + changing)
               if set(common.git("ls-tree", "-r", "--name-only", c, "--", *BUILD_FILES).split()) == set(BUILD_FILES)]
    if not commits:
        raise common.UserError(f"no commit of {common.BRANCH} has a buildable package ({', '.join(BUILD_FILES)})")
    return sample_commits(commits, bound)


def sample_commits(commits, bound):
    """At most ``bound`` of ``commits`` (newest first): the NEWEST, then every ``stride``-th older one counted from
    the oldest, ``stride`` the smallest power of two that fits. Stable as history grows: a new commit changes the
    older ones only when the stride doubles, to a subset (asv's ``--steps`` re-spreads them every time)."""
    newest, older = commits[:min(NEWEST, bound)], commits[NEWEST:][::-1]  # older: oldest first
    room = bound - len(newest)
    if room <= 0 or not older:
        return newest
    stride = 1
    while math.ceil(len(older) / stride) > room:
        stride *= 2
    spread = set(older[::stride])
    return newest + [c for c in commits[NEWEST:] if c in spread]


def to_measure(machine, commits, benchmarks):
    """``commits`` lacking a benchmark of benchmarks.json at its version (asv ignores a result of another)."""
    want = {(name, info.get("version")) for name, info in benchmarks.items()} or {None}  # no suite yet: all
    return [c for c in commits if not want <= {(p.benchmark, p.version) for p in results.stored(machine, c).values()}]


def beside_parent(commits, todo):
    """``[main~1, main]`` when main is to be measured and main~1 is in the sample, else ``[]``: their timings and peak
    RSS are taken in one asv run, rounds interleaved (as ``asv continuous`` does), not each in a run of its own."""
    parent = common.git("rev-list", "--first-parent", "--skip=1", "--max-count=1", commits[0])
    return commits[1::-1] if commits[0] in todo and commits[1:2] == [parent] else []


def answers_source(machine, tip):
    """The newest commit of main's history with answers stored on ``machine`` if its package and suites (RESULT_PATHS,
    SUITES) are main's, else None (they are measured at main): a commit that changes neither pays no new answers."""
    stored = {path.name[:8] for path in (common.ROOT / ".asv" / "answers" / machine).glob("*-*.json")}
    newest = next((c for c in common.git("rev-list", "--first-parent", tip).split() if c[:8] in stored), None)
    same = newest and not common.run("git", "diff", "--quiet", newest, tip, "--", *RESULT_PATHS, *SUITES, check=False)
    return newest if same else None


def minutes(seconds):
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def describe(commit, name=""):
    return f"{name} {commit[:8]} {common.git('log', '-1', '--format=%s', commit)[:60]!r}".strip()


def heading(text):
    print(f"\n== {time.strftime('%H:%M:%S')} {text} ==", flush=True)


def summary(machine, commits, tip, measured):
    """Print main against the newest older commit with results; the failures at main."""
    stored = {c: results.stored(machine, c) for c in commits}
    if not stored[tip]:
        raise common.UserError(f"{common.BRANCH} ({tip[:8]}) has no results: its build or install failed (see above)")
    older = next((c for c in commits[1:] if stored[c]), None)
    if older:
        base, head = stored[older], stored[tip]
        heading(f"summary: {describe(tip, common.BRANCH)} against {describe(older, 'the older')}")
        marked = asv_compare(older, tip, machine, UNPAIRED_FACTOR)
        worse, better = ([label for mark, label in marked if mark in marks] for marks in ("+!", "-"))
        flagged = [label for label in worse if method_of(label).startswith("time_")]
        work = exact_regressions(base, head)
        time_worse, counts = [], [w for w in work if w[2] == "work"]
        if flagged and tip in measured:  # asv's samples flag these: the gate's pairs confirm or clear each
            paired, _ = pair({"base": older, "head": tip}, flagged, base, head, DEFAULT_FACTOR)
            time_worse = [(label, p.ratio) for label, p in paired.items() if p.worse(DEFAULT_FACTOR)]
        print(f"asv compare marked {len(worse)} row(s) worse and {len(better)} better; of the {len(flagged)} "
              f"timing(s) marked worse, {len(time_worse)} worse in pairs"
              + ("" if tip in measured or not flagged else " (measured earlier: the gate pairs)")
              + f"; counts {len(counts)} worse, other values {len(work) - len(counts)} worse")
        for label, ratio in [(label, ratio) for label, ratio, _ in work][:NAMED] + time_worse[:NAMED]:
            print(f"      worse {ratio_text(ratio)}  {label}")
    page = publish.regressions(common.ROOT / ".asv" / "html")
    mine = [row for row in page if row[2] == tip]
    print(f"the dashboard's Regressions page: {len(mine)} row(s) blame {tip[:8]}" + ":" * bool(mine))
    for label, first, _, before, after in mine[:2 * NAMED]:
        print(f"      {ratio_text(after / before) if before else 'from 0'}  {label}"
              + (f"  (somewhere in {first[:8]}..{tip[:8]})" if first else ""))
    older_rows = [row for row in page if row[2] != tip]
    blamed = sorted({f"{first[:8]}..{last[:8]}" if first else last[:8] for _, first, last, _, _ in older_rows})
    named = f" ({', '.join(blamed[:4])}{', ...' * (len(blamed) > 4)})" if blamed else ""
    print(f"it holds {len(older_rows)} older row(s): jumps asv found between older commits of the sample, blamed on "
          f"{len(blamed)} commit(s) or range(s) before {tip[:8]}{named}")
    print(f"this summary is not a gate: the gate is `python3 tools/dev.py gate {common.BRANCH}~1 {common.BRANCH}`")
    parent = common.git("rev-list", "--first-parent", "--skip=1", "--max-count=1", tip)
    return failures(results.stored(machine, parent) if parent else {}, stored[tip])


def figures(run):
    """The lab's four answers, the model's batching and prompt lookup's speedup in ``run``: ``[(what, text)]``."""
    from ..report import tables as t

    def ends(table, column):  # the first and the last T
        return " … ".join(f"{t.format_cell(row[column], table.kinds[column])} at T = {key[0]}"
                          for key, row in table.rows[:1] + table.rows[1:][-1:])

    cache, batch = t.cache_table(run), t.batch_table(run)
    exact = [row["equal to full attention"] for _, row in cache.rows]
    model = [row["over B = 1"] for (_, b), row in t.model_batch_table(run).rows if b == 8]
    copy = [row["greedy / prompt lookup"] for (p, k), row in t.speculative_table(run).rows
            if p == "copy" and k == t.bench_speculative.SPEEDUP_K]
    return [("1. equal to full attention", f"{exact.count('yes, all 3')} of {len(exact)} lengths"),
            ("2. concat / preallocated", ends(cache, "concat / preallocated")),
            ("3. batch speedup, B = 2", ends(batch, "speedup")),
            ("4. saved / step, µs", ends(batch, "saved / step, µs")),
            ("   batched / step, µs", ends(batch, "batched / step, µs")),
            ("model, B = 8 over B = 1", t.format_cell(model[0], "ratio3") if model else "n/a"),
            ("prompt lookup over greedy, copy", t.format_cell(copy[0], "ratio") if copy else "n/a")]


QUOTED = ["cache", "cache", "batch", "batch", "batch", "model_batch", "speculative"]  # the table of each figure


def quoted_runs():
    """``{experiment or figure: (machine, commit)}`` of the runs README.md (first) and docs/ quote."""
    from ..report import pages

    quoted = {}
    for text in (page.read_text() for page in pages.PAGES):
        for command in [m[1] for m in pages.RENDERED.finditer(text)] + [c for c, _ in pages.PLOTTED.findall(text)]:
            argv = shlex.split(command)
            option = dict(zip(argv, argv[1:]))
            for name in [b for a, b in zip(argv, argv[1:]) if a in ("--experiment", "--figure")]:
                quoted.setdefault(name, (option["--machine"], option["--commit"]))
    return quoted


def print_answers(machine, source):
    """:func:`figures` of ``source``'s results here beside those of the runs the README quotes (docs/results), each
    with its machine, and the command that renders every table from these results."""
    run, quoted, docs = results.ResultsDir(str(results.results_dir())).load(machine, source), quoted_runs(), \
        results.ResultsDir(str(common.ROOT / "docs" / "results"))
    keys = [quoted.get(name) or quoted.get(name.split("_")[0]) for name in QUOTED]  # model_batch: the model figure
    theirs = {key: (figures(docs.load(*key)), f"{key[1][:8]} on {key[0]}, {docs.load(*key).machine_params.get('cpu')}")
              for key in set(filter(None, keys))}
    heading(f"the answers measured here ({machine}, {run.machine_params.get('cpu')}) at {source[:8]}; the README's")
    for i, (what, text) in enumerate(figures(run)):
        quote, where = theirs.get(keys[i], (None, None))
        print(f"  {what:<32} here: {text}\n  {'':<32} README: " + (f"{quote[i][1]} ({where})" if quote else "none"))
    print(f"every table of these results: python3 tools/dev.py report tables --machine {machine} --commit {source[:8]}")


def verdict(tip, failed):
    """Exit 2 naming each point that failed at main's tip or vanished there since main~1, else 0."""
    failed = [(label, role) for label, role in failed if role == "head"]
    print_failures(failed, lambda role: f"{common.BRANCH} {tip[:8]}")
    if failed:
        print(f"bench: exit 2 ({len(failed)} point(s) failed or vanished at {common.BRANCH})")
    return 2 if failed else 0


def run(args):
    commits = select_commits(args.commits)
    machine = common.record_machine()
    heading("asv run --bench just-discover: benchmarks.json of the working tree's suite, with its versions")
    common.asv_run(commits, machine, "--bench", "just-discover")
    todo = to_measure(machine, commits, results.suite())
    beside, source = beside_parent(commits, todo), answers_source(machine, commits[0])
    alone = [c for c in todo if c not in beside]
    estimate = (SECONDS_PER_COMMIT * len(alone) + UNTIMED * (len(todo) - len(alone)) + BESIDE * bool(beside)
                + ANSWERS * (source is None) + PUBLISH + 2 * PER_PAIRED_POINT * bool(todo)  # a point or two, at most
                + (0 if (common.ROOT / ".asv" / "env").is_dir() else FIRST_ENV))
    load = max(os.getloadavg()[::2])  # the 1 or 15 min average: 4 runs within 10 %, 1 42 % over
    estimate *= max(1.0, load / os.cpu_count()) ** 0.7
    about = f"about {minutes(estimate)} with publish and pairs at load {load:.1f}" if todo or source is None else \
        "nothing to measure, a publish only"
    print(f"{len(commits)} commit(s) of {common.BRANCH} selected; {len(commits) - len(todo)} already have results on "
          f"{machine!r}, benchmarking {len(todo)}: {about}", flush=True)
    started = time.monotonic()
    if alone:
        heading(f"asv run: the regression suite (benchmarks/) on {len(alone)} commit(s) of {common.BRANCH}")
        common.asv_run(alone, machine)
    if beside:
        heading(f"asv run: the regression suite without timings and peak RSS, at {common.BRANCH} and {common.BRANCH}~1")
        common.asv_run([c for c in beside if c in todo], machine, "--bench", ALONE)
        heading(f"asv run: {common.BRANCH}~1 beside {common.BRANCH}, timings and peak RSS, rounds interleaved")
        common.asv_run(beside, machine, "--bench", SIDE_BY_SIDE, "--interleave-rounds", skip_existing=False)
    if source is None:
        heading(f"asv run: the lab's answers (answers/) at {common.BRANCH}")
        common.asv_run(commits[:1], machine, config=common.answers_config())
        source = commits[0]
    else:
        print(f"\nthe lab's answers: those stored for {describe(source)} stand, its package and suites are main's")
    heading("asv publish")
    publish.publish()
    tip = common.git("rev-parse", common.BRANCH)
    failed = summary(machine, commits, tip, todo) + failures({}, results.stored(machine, source, answers=True))
    print_answers(machine, source)
    print(f"\n{publish.VIEW}\n[bench] done in {minutes(time.monotonic() - started)}")
    return verdict(tip, failed)
